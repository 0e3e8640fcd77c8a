"""Issue 18, as a hostile user would try it: every bad input and fault gets one line naming the
problem and the fix (no traceback), before any work where it can be known before, and no run
trains wrong in silence. `CLI_CASES` is also the source of the table in docs/bad_inputs.md
(`python scripts/bad_input_table.py`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mmrl.cli import main
from mmrl.errors import ConfigChangedError, RunLockedError, TrainingError, UserError
from mmrl.experiment import build_trainer
from mmrl.trainer import checkpoint
from tests.trainer.test_trainer import TINY, params, tiny_cfg

TABLE_TITLE = "Issue 18 and after: config, data and checkpoints"
QUICK = ["configs/quickstart.yaml", *TINY, "trainer.video_episodes=0"]
GEN = [
    "sim.num_envs=8",
    "sim.eval_num_envs=8",
    "sim.kwargs={dataset: shapes_prompts, image_size: 16}",
    "policy.image_size=16",
    "policy.width=16",
    "policy.num_steps=3",
    "policy.eval_num_steps=3",
    "algorithm.group_size=4",
    "algorithm.minibatch_size=8",
    "trainer.iterations=1",
    "trainer.eval_episodes=8",
    "trainer.video_episodes=0",
    "warm_start.steps=2",
]

#: (case, `mmrl` arguments after the command, words the one-line error must hold); {out} is a run
#: folder of the tiny quickstart trained for 2 iterations, {tmp} an empty temporary folder
CLI_CASES = [
    ("sim.num_envs=0", ["train", *QUICK, "sim.num_envs=0"], ["'num_envs' = 0", ">= 1"]),
    ("trainer.lr=-1", ["train", *QUICK, "trainer.lr=-1"], ["'lr' = -1.0", "> 0"]),
    ("trainer.checkpoint_every=0", ["train", *QUICK, "trainer.checkpoint_every=0"], ["'checkpoint_every' = 0"]),
    ("algorithm.minibatch_size=0", ["train", *QUICK, "algorithm.minibatch_size=0"], ["'minibatch_size' = 0"]),
    ("trainer.eval_episodes=0", ["train", *QUICK, "trainer.eval_episodes=0"], ["'eval_episodes' = 0"]),
    ("trainer.iterations=-3", ["train", *QUICK, "trainer.iterations=-3"], ["'iterations' = -3"]),
    ("algorithm.gamma=2", ["train", *QUICK, "algorithm.gamma=2"], ["'gamma' = 2.0", "between 0 and 1"]),
    ("algorithm.clip_low=-0.5", ["train", *QUICK, "algorithm.clip_low=-0.5"], ["'clip_low' = -0.5"]),
    ("trainer.keep_checkpoints=0", ["train", *QUICK, "trainer.keep_checkpoints=0"], ["'keep_checkpoints' = 0"]),
    (
        "warm_start.candidate_steps=10 (of 3 steps)",
        ["train", *QUICK, "warm_start.candidate_steps=10"],
        ["'candidate_steps' = 10", "1 <= candidate_steps <= steps"],
    ),
    (
        "warm_start.held_in=8 with a fixed seed",
        ["train", *QUICK, "warm_start.held_in=8", "warm_start.kwargs={seed: 3}"],
        ["'held_in' = 8", "fixes 'seed'"],
    ),
    (
        "background rollouts with the initial action std's probe (the state template's default)",
        ["train", "configs/gym_inverted_pendulum.yaml", "trainer.rollout_steps=0", "trainer.async_staleness=1"],
        ["'trainer.async_staleness' = 1", "policy.action_log_std_init to a number"],
    ),
    ("run.device=cuda without CUDA", ["train", *QUICK, "run.device=cuda"], ["run.device = 'cuda'", "run.device=cpu"]),
    (
        "eval with run.device=cuda without CUDA",
        ["eval", *QUICK, "run.device=cuda", "checkpoint={out}"],
        ["run.device = 'cuda'", "run.device=cpu"],
    ),
    ("run.device=gpu0", ["train", *QUICK, "run.device=gpu0"], ["'device' = 'gpu0' is not a device"]),
    ("run.threads=-2", ["train", *QUICK, "run.threads=-2"], ["'threads' = -2"]),
    (
        "policy.chunk_size longer than the episode",
        ["train", *QUICK, "policy.chunk_size=16"],
        ["policy.chunk_size = 16 is longer than an episode", "12 steps"],
    ),
    (
        "an objective the policy cannot do",
        ["train", *QUICK, "policy.critic=false", "algorithm.advantage=gae"],
        ["'algorithm.advantage' = 'gae' needs a critic", "set policy.critic=true"],
    ),
    (
        "output folder that cannot be written",
        ["train", *QUICK, "run.output_dir={tmp}/file/x"],
        ["cannot write the run folder", "run.output_dir"],
    ),
    (
        "a reward server that does not answer",
        [
            "train",
            "configs/diffusion_shapes_flow_grpo.yaml",
            *GEN,
            "reward={type: http, kwargs: {url: 'http://127.0.0.1:9', retries: 0}}",
        ],
        ["reward 'http' cannot score", "http://127.0.0.1:9 is unreachable", "python -m rewards.http"],
    ),
    (
        "a video policy and a video simulator of other frame counts",
        ["train", "configs/video_shapes_nft.yaml", "sim.kwargs.num_frames=4", "warm_start.steps=2"],
        ["policy.image_size = 16 and policy.num_frames = 8", "sim.kwargs.num_frames to 8"],
    ),
    (
        "a Wan pipeline without policy.num_frames",
        [
            "train",
            "configs/video_shapes_nft.yaml",
            "policy.model=Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
            "policy.num_frames=0",
        ],
        ["is a Wan text-to-video pipeline", "set policy.num_frames"],
    ),
    (
        "check simulator with an unknown argument",
        ["check", "simulator", "reach", "bogus=1"],
        ["'bogus' is not an argument of simulator 'reach'", "Valid:"],
    ),
    (
        "a gym env argument outside env_kwargs",
        ["check", "simulator", "gym:CartPole-v1", "sutton_barto_reward=true"],
        [
            "'sutton_barto_reward' is not an argument of simulator 'gym:CartPole-v1'",
            'go under env_kwargs: "env_kwargs={sutton_barto_reward: True}"',
        ],
    ),
    (
        "a gym env argument outside env_kwargs, in a config",
        ["train", "configs/gym_pendulum.yaml", "sim.kwargs.g=9.0"],
        ["'kwargs.g' is not an argument of simulator 'gym'", "go under kwargs.env_kwargs: {g: 9.0}"],
    ),
    (
        "an unknown argument of a VLM dataset",
        ["train", "configs/vlm_quickstart.yaml", "sim.kwargs.dataset_kwargs={num_sample: 64}"],
        ["dataset 'shapes_vqa' has no argument 'num_sample'", "did you mean 'num_samples'"],
    ),
    (
        "VLM data without a ground-truth column (no answer, no solution)",
        [
            "train",
            "configs/vlm_quickstart.yaml",
            "sim.kwargs.dataset=vlm_records",
            "sim.kwargs.dataset_kwargs={path: {tmp}/qa.jsonl}",
        ],
        ["dataset 'vlm_records'", "qa.jsonl, line 1: no 'answer' column (its columns: prompt, result)", "answer_key"],
    ),
    (
        "TRL's reward_weights not one per reward_funcs",
        ["train", "configs/vlm_quickstart.yaml", "reward.type=[short_answer, counting]", "reward.weights=[1.0]"],
        ["'weights' must be a list of 2 numbers, one per reward in 'type' (TRL's reward_weights)"],
    ),
    (
        "a reward function file that is not there",
        ["train", "configs/vlm_quickstart.yaml", "reward.type={tmp}/nope.py:accuracy"],
        ["reward file", "nope.py not found"],
    ),
    (
        "another tool's name for a key (TRL's learning_rate)",
        ["train", *QUICK, "--learning_rate", "1e-4"],
        ["unknown config key 'learning_rate'", "mmrl's name for it: trainer.lr"],
    ),
    ("eval with no checkpoint", ["eval", *QUICK, "checkpoint={tmp}/nothing"], ["does not exist", "checkpoint=PATH"]),
    (
        "eval on a folder of an empty state.pt (no completion marker)",
        ["eval", *QUICK, "checkpoint={tmp}/empty"],
        ["is not usable", "COMPLETE is missing (the checkpoint was never completed)"],
    ),
    (
        "eval on a folder of a random state.pt (no completion marker)",
        ["eval", *QUICK, "checkpoint={tmp}/random"],
        ["is not usable", "COMPLETE is missing (the checkpoint was never completed)"],
    ),
    (
        "eval on a truncated state.pt (with its marker)",
        ["eval", *QUICK, "checkpoint={out}/checkpoints/iter_000001"],
        ["does not match its checksum"],
    ),
    (
        "eval on a checkpoint of another config",
        ["eval", *QUICK, "policy.dim=32", "checkpoint={out}"],
        ["weights of another policy config", "policy.dim 16 (checkpoint) vs 32", "mmrl eval"],
    ),
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-iteration tiny run (checkpoints iter_000001, iter_000002) to break in the eval cases."""
    out = tmp_path_factory.mktemp("trained")
    build_trainer(tiny_cfg(out, "trainer.video_episodes=0", "trainer.keep_checkpoints=2")).run()
    return out / "t"


def prepare(tmp: Path, out: Path) -> None:
    (tmp / "file").write_text("a file where a folder should be")
    (tmp / "qa.jsonl").write_text('{"prompt": "What is 1+1?", "result": "2"}\n')
    (tmp / "empty").mkdir()
    (tmp / "empty" / "state.pt").write_bytes(b"")
    (tmp / "random").mkdir()
    (tmp / "random" / "state.pt").write_bytes(os.urandom(4096))
    state = out / "checkpoints" / "iter_000001" / "state.pt"
    if state.stat().st_size > 100:
        state.write_bytes(state.read_bytes()[:100])  # truncated behind its completion marker


def assert_one_clear_line(argv, words, trained: Path, tmp_path: Path, capsys) -> None:
    """Run ``mmrl ARGV`` ({out}: the trained run, {tmp}: ``tmp_path``, a `train` writing there): exit 2,
    one ``error:`` line holding ``words``, no traceback; a `train` case trained and wrote nothing."""
    argv = [a.replace("{out}", str(trained)).replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] == "train" and not any("run.output_dir" in a for a in argv):
        argv.insert(2, f"run.output_dir={tmp_path}")
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(lines) == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], lines[0]
    if argv[0] == "train":  # known before any work: nothing was trained or written
        assert not list(tmp_path.glob("*/checkpoints"))


@pytest.mark.parametrize("case,argv,words", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_input_is_one_clear_line(case, argv, words, trained, tmp_path, capsys):
    prepare(tmp_path, trained)
    assert_one_clear_line(argv, words, trained, tmp_path, capsys)


def test_eval_accepts_a_run_folder(trained, tmp_path, capsys):
    rc = main(["eval", *QUICK, f"run.output_dir={tmp_path}", "run.name=t", f"checkpoint={trained}"])
    assert rc == 0
    assert not (tmp_path / "t").exists()  # the report goes with the checkpoint (issue 32), not the config's run
    report = json.loads((trained / "eval_report.json").read_text())
    assert report["checkpoint"].endswith("iter_000002")
    for file in ("model.safetensors", "state.pt"):  # or one file of a checkpoint: its folder, its config
        assert main(["eval", str(trained / "checkpoints" / "iter_000002" / file)]) == 0
        again = json.loads((trained / "eval_report.json").read_text())
        assert again["checkpoint"].endswith("iter_000002") and again["success_rate"] == report["success_rate"]


# ---- silent wrong training -------------------------------------------------------------------
def nan_rewards(trainer, episodes: int, calls=(0,)):
    """Make the training simulator return NaN as the reward of the first ``episodes`` envs on
    the step calls numbered ``calls`` (0 = the first step of the first RL iteration)."""
    sim, real, seen = trainer.collector.sim, trainer.collector.sim.step_chunk, [0]

    def step_chunk(actions):
        res = real(actions)
        if seen[0] in calls:
            res.reward[:episodes] = float("nan")
        seen[0] += 1
        return res

    sim.step_chunk = step_chunk


def test_a_nan_reward_drops_its_episode_counts_it_and_results_stay_strict_json(tmp_path, capsys):
    trainer = build_trainer(
        tiny_cfg(tmp_path, "trainer.video_episodes=0", "trainer.iterations=2", "trainer.max_nonfinite_fraction=0.2")
    )
    nan_rewards(trainer, 1)
    results = trainer.run()
    out = capsys.readouterr().out
    assert "1 episode(s) with a NaN or infinite reward from the simulator 'reach'" in out
    assert trainer.state.nonfinite_episodes == 1 and trainer.state.episodes == 15
    assert trainer.state.skipped_steps == 0  # the NaN never reached the loss
    text = (tmp_path / "t" / "results.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"results.json holds {c}"))
    for line in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line, parse_constant=lambda c, line=line: pytest.fail(f"metrics.jsonl holds {c}: {line}"))
        assert row.get("train/return") is None or row["train/return"] == row["train/return"]
    assert all(v == v for v in results["final"].values() if isinstance(v, float))


def test_too_many_nan_rewards_stop_the_run_with_a_clear_error(tmp_path):
    trainer = build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0", "trainer.iterations=3"))
    nan_rewards(trainer, 4)
    with pytest.raises(TrainingError, match=r"4 of 8 episodes had a NaN or infinite reward.*max_nonfinite_fraction"):
        trainer.run()
    assert (tmp_path / "t" / "checkpoints" / "iter_000000" / "COMPLETE").exists()  # the warm start is kept


def test_skipped_steps_in_a_row_stop_the_run(tmp_path, monkeypatch):
    from mmrl.capabilities import Component
    from mmrl.registry import OBJECTIVES, Entry

    trainer = build_trainer(
        tiny_cfg(tmp_path, "trainer.video_episodes=0", "trainer.max_skipped_steps=3", "algorithm.epochs=4")
    )
    name = trainer.cfg.algorithm.objective
    real = OBJECTIVES.get(name)
    nan_loss = Component(lambda *a: (lambda loss, m: (loss * float("nan"), m))(*real(*a)), real.needs)
    monkeypatch.setitem(OBJECTIVES._entries, name, Entry(name, nan_loss))
    with pytest.raises(TrainingError, match="3 optimizer steps in a row were skipped"):
        trainer.run()
    assert trainer.state.iteration == 0


def test_an_iteration_that_lost_every_episode_is_collected_again_not_counted(tmp_path, monkeypatch):
    from mmrl.trainer import collectors

    reference = build_trainer(tiny_cfg(tmp_path / "ref", "trainer.video_episodes=0"))
    reference.run()
    real, calls = collectors.collect, [0]

    def crash_once(policy, sim, seeds, generator, **kw):
        batch, info = real(policy, sim, seeds, generator, **kw)
        calls[0] += 1
        if calls[0] == 1:  # the first RL collection: every worker crashed
            info.update(lost=torch.ones(len(seeds), dtype=torch.bool), lost_episodes=len(seeds))
        return batch, info

    monkeypatch.setattr(collectors, "collect", crash_once)
    trainer = build_trainer(tiny_cfg(tmp_path / "b", "trainer.video_episodes=0"))
    trainer.run()
    assert trainer.state.iteration == 2 and trainer.state.lost_episodes == 8
    assert trainer.state.episodes == reference.state.episodes
    rows = [json.loads(x) for x in (tmp_path / "b" / "t" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/return" in r] == [1, 2]
    # the round was collected again with the same seeds: training ends where the reference did
    a, b = params(reference.policy), params(trainer.policy)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_every_collection_lost_stops_with_a_clear_error(tmp_path, monkeypatch):
    from mmrl.trainer import collectors

    real = collectors.collect

    def always_lost(policy, sim, seeds, generator, **kw):
        batch, info = real(policy, sim, seeds, generator, **kw)
        info.update(lost=torch.ones(len(seeds), dtype=torch.bool), lost_episodes=len(seeds))
        return batch, info

    trainer = build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0"))
    monkeypatch.setattr(collectors, "collect", always_lost)
    with pytest.raises(TrainingError, match="iteration 1 lost every episode 3 times in a row"):
        trainer.run()
    assert trainer.state.iteration == 0


def test_a_simulator_whose_images_are_not_the_declared_size_fails_at_the_boundary(tmp_path):
    trainer = build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0"))
    assert trainer.eval_sim.image_shape == (32, 32, 3)
    trainer.eval_sim.image_shape = (64, 64, 3)  # declares 64 px, renders 32
    with pytest.raises(
        UserError, match=r"returned images torch.uint8 \[8, 32, 32, 3\] but declares uint8 \[8, 64, 64, 3\]"
    ):
        trainer.run()


# ---- resume under a changed config -----------------------------------------------------------
def test_resume_with_a_changed_config_is_refused_naming_the_keys(tmp_path):
    build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0")).run()
    for change in (["algorithm.clip_low=0.1"], ["run.seed=3"], ["sim.num_envs=16"], ["trainer.value_lr=1e-3"]):
        with pytest.raises(
            ConfigChangedError, match=f"{change[0].split('=')[0]} .* -> .*new run.*accept_config_change"
        ):
            build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0", "trainer.iterations=3", *change))
    saved = (tmp_path / "t" / "checkpoints" / "iter_000002" / "config.yaml").read_text()
    assert "clip_low: 0.2" in saved  # the checkpoint still says what its weights were trained with


def test_resume_with_more_iterations_or_other_eval_settings_is_fine(tmp_path):
    build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0")).run()
    trainer = build_trainer(
        tiny_cfg(
            tmp_path,
            "trainer.video_episodes=0",
            "trainer.iterations=3",
            "trainer.eval_episodes=16",
            "trainer.keep_checkpoints=3",
        )
    )
    trainer.run()
    assert trainer.state.iteration == 3


def test_an_accepted_config_change_is_recorded(tmp_path, capsys):
    build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0")).run()
    trainer = build_trainer(
        tiny_cfg(
            tmp_path,
            "trainer.video_episodes=0",
            "trainer.iterations=3",
            "algorithm.clip_low=0.1",
            "trainer.accept_config_change=true",
        )
    )
    trainer.run()
    assert trainer.state.iteration == 3
    history = [json.loads(x) for x in (tmp_path / "t" / "config_history.jsonl").read_text().splitlines()]
    assert history == [
        {
            "time": history[0]["time"],
            "checkpoint": "iter_000002",
            "changes": {"algorithm.clip_low": {"from": 0.2, "to": 0.1}},
        }
    ]
    assert "under a changed config" in capsys.readouterr().out


# ---- the run folder --------------------------------------------------------------------------
def test_a_second_process_in_the_same_run_folder_is_refused_naming_the_first(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from mmrl.trainer.run_folder import open_run_folder; "
            f"f = open_run_folder({str(tmp_path / 't')!r}); print('locked', flush=True); "
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError, match=rf"in use by another process \(pid {holder.pid} on .*run.name"):
            build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0"))
    finally:
        holder.kill()
        holder.wait()
    build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0")).run()  # a killed holder leaves no stale lock


def test_disk_full_while_checkpointing_is_one_line(tmp_path, monkeypatch):
    import shutil

    from mmrl.trainer import checkpoint

    trainer = build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0"))

    def full(*a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0: file write failed")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10 << 30, 10 << 30, 1 << 20))
    with pytest.raises(UserError, match=r"no space left on the device .* free some space and run the same command"):
        trainer.run()


# ---- signals ---------------------------------------------------------------------------------
def _interrupt(tmp_path, sig) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "mmrl.cli",
        "train",
        *QUICK,
        f"run.output_dir={tmp_path}",
        "run.name=s",
        "trainer.iterations=200",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        # as from a terminal: a test run started in the background by a shell (`cmd &`) passes SIGINT
        # down ignored, and Python then never turns it into KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    first = tmp_path / "s" / "checkpoints" / "iter_000001" / "COMPLETE"
    deadline = time.time() + 120
    while not first.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.parametrize(
    "sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")]
)
def test_sigint_and_sigterm_say_where_the_run_stopped_and_how_to_resume(tmp_path, sig, code, word):
    done = _interrupt(tmp_path, sig)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == code, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert last.startswith(f"{word} at iteration ") and "run the same command to resume" in last, last
    assert "newest complete checkpoint: iter_" in last


def test_strict_json(tmp_path):
    """NaN and infinities become null in every JSON file mmrl writes (the log, results, reports)."""
    from mmrl.trainer.logging import RunLogger
    from mmrl.utils import jsonio

    bad = {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": float("-inf"), "e": 2}}
    assert jsonio.dumps(bad) == '{"a": null, "b": [1.0, null], "c": {"d": null, "e": 2}}'
    logger = RunLogger(tmp_path)
    logger.log(3, {"train/return": float("nan"), "train/length": torch.tensor(4.0)})
    logger.close()
    jsonio.write_json(tmp_path / "results.json", {"final": {"return": float("nan")}})
    strict = dict(parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert json.loads((tmp_path / "metrics.jsonl").read_text(), **strict) == {
        "step": 3,
        "train/return": None,
        "train/length": 4.0,
    }
    assert json.loads((tmp_path / "results.json").read_text(), **strict) == {"final": {"return": None}}


def test_eval_of_a_run_folder_reproduces_the_training_final_number(trained, capsys):
    """`mmrl eval RUN` uses the checkpoint's own config and the training's evaluation draws."""
    final = json.loads((trained / "results.json").read_text())["final"]
    assert main(["eval", str(trained)]) == 0
    report = json.loads((trained / "eval_report.json").read_text())
    assert report["checkpoint"].endswith("iter_000002") and report["episodes"] == final["episodes"]
    assert (report["success_rate"], report["return"], report["length"]) == (
        final["success_rate"],
        final["return"],
        final["length"],
    )


def test_load_policy_needs_no_simulator_and_acts_as_the_trained_one(trained, monkeypatch):
    import mmrl
    from mmrl import registry

    monkeypatch.setattr(registry.SIMULATORS, "build", lambda *a, **k: pytest.fail("a simulator was built"))
    policy = mmrl.load_policy(trained)
    saved = checkpoint.read_weights(trained / "checkpoints" / "iter_000002")[0]
    mine = policy.state_dict()
    assert mine.keys() == saved.keys() and all(torch.equal(mine[k], saved[k]) for k in mine)
    assert not policy.training
    monkeypatch.undo()
    # it acts exactly as the policy built the usual way (with its simulator) from the same checkpoint
    from mmrl.experiment import build_policy, build_sim, load_experiment

    cfg = load_experiment(trained / "checkpoints" / "iter_000002" / "config.yaml")
    sim = build_sim(cfg, 4, 5, evaluation=True)
    reference = build_policy(cfg, sim)
    reference.load_state_dict(saved)
    reference.eval()
    obs = sim.reset([11, 12, 13, 14])
    a = policy.rollout(obs, torch.Generator().manual_seed(3), mode="eval").actions
    b = reference.rollout(obs, torch.Generator().manual_seed(3), mode="eval").actions
    assert torch.equal(a, b)


def test_fixed_length_rollouts_mask_a_nan_reward_and_count_it(tmp_path, capsys):
    """Episodes go on across rounds there, so the NaN decision is masked (not valid), not the episode."""
    trainer = build_trainer(
        tiny_cfg(tmp_path, "trainer.video_episodes=0", "trainer.rollout_steps=2", "trainer.max_nonfinite_fraction=1.0")
    )
    nan_rewards(trainer, 2)
    trainer.run()
    assert trainer.state.nonfinite_episodes == 2 and trainer.state.skipped_steps == 0
    assert "2 episode(s) with a NaN or infinite reward" in capsys.readouterr().out
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["train/policy_loss"] == r["train/policy_loss"] for r in rows if "train/policy_loss" in r)
