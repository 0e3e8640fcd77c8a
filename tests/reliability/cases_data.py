"""Issue 32's command-line cases (data): (case, `mmrl` arguments, words the one `error:` line
must hold), run by tests/reliability/test_round_three.py and tabled in docs/bad_inputs.md by
scripts/bad_input_table.py. {out}: a 2-iteration tiny quickstart run folder; {tmp}: a fresh folder
that `prepare` fills."""

from __future__ import annotations

from pathlib import Path

VLM = ["train", "configs/vlm_quickstart.yaml", "sim.kwargs.dataset=vlm_records"]
PROMPTS = ["train", "configs/diffusion_shapes_flow_grpo.yaml", "sim.kwargs.dataset=prompt_list"]
LIMIT = 200  # bytes: max_record_bytes of the too-long-line case (the default is 16 MiB)

CASES: list[tuple[str, list[str], list[str]]] = [
    (
        "a vlm_records JSONL line longer than max_record_bytes",
        [*VLM, f"sim.kwargs.dataset_kwargs={{path: {{tmp}}/long.jsonl, max_record_bytes: {LIMIT}}}"],
        [
            "dataset 'vlm_records'",
            "long.jsonl, line 2: 1043 bytes, over the limit of 200 bytes on one record",
            "raise the limit with the dataset argument max_record_bytes",
        ],
    ),
    (
        "a vlm_records JSONL line that is not UTF-8",
        [*VLM, "sim.kwargs.dataset_kwargs={path: {tmp}/latin1.jsonl}"],
        ["dataset 'vlm_records'", "latin1.jsonl, line 2: not UTF-8 text (byte 0xe9", "save the file as UTF-8"],
    ),
    (
        "a prompt_list text line that is not UTF-8",
        [*PROMPTS, "sim.kwargs.dataset_kwargs={path: {tmp}/latin1.txt}"],
        ["dataset 'prompt_list'", "latin1.txt, line 3: not UTF-8 text (byte 0xe9", "save the file as UTF-8"],
    ),
    (
        "a gym env_id gymnasium has not registered (train)",
        ["train", "configs/gym_pendulum.yaml", "sim.kwargs.env_id=Pendulum-v2"],
        ["env_id 'Pendulum-v2' is not a registered gymnasium environment", "close registered ids: Pendulum-v1"],
    ),
    (
        "a gym env_id gymnasium has not registered (check simulator)",
        ["check", "simulator", "gym:CartPol-v1"],
        ["env_id 'CartPol-v1' is not a registered", "close registered ids: CartPole-v1"],
    ),
    (
        "policy.num_steps=0 (flow integration steps)",
        ["train", "configs/quickstart.yaml", "policy.num_steps=0"],
        ["'policy'", "'num_steps' = 0 must be >= 1"],
    ),
    (
        "policy.eval_num_steps=0 (diffusion denoising steps)",
        ["train", "configs/diffusion_shapes_flow_grpo.yaml", "policy.eval_num_steps=0"],
        ["'policy'", "'eval_num_steps' = 0 must be >= 1"],
    ),
]


def prepare(tmp: Path, out: Path) -> None:
    """Write the files this module's cases use into tmp (out: the trained run folder)."""
    good = '{"prompt": "What is 1+1?", "answer": "2"}\n'
    (tmp / "long.jsonl").write_text(good + '{"prompt": "What is 1+1?", "answer": "2", "note": "' + "x" * 990 + '"}\n')
    (tmp / "latin1.jsonl").write_bytes(
        (good + '{"prompt": "Combien de caf\u00e9s?", "answer": "2"}\n').encode("latin-1")
    )
    (tmp / "latin1.txt").write_bytes("a red circle\n\na caf\u00e9 with two cups\n".encode("latin-1"))
