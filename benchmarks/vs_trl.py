"""mmrl vs TRL: time of one GRPO step on the same tiny VLM, data, group size and settings (CPU).

    pip install trl==1.16.0 accelerate==1.15.0 datasets==5.2.0   # dev-only, not in pyproject.toml
    python benchmarks/vs_trl.py                    # 8 prompts x 8 answers, 4 new tokens, 1 + 8 steps x 2 rounds
    python benchmarks/vs_trl.py --steps 8 --rounds 3 --max-new-tokens 16 --threads 2

Both sides train the same model: ``mmrl.testing.tiny_models.tiny_image_text_model(seed=0)``, a
real ``Idefics3ForConditionalGeneration`` + ``Idefics3Processor`` (the SmolVLM architecture, random
weights, offline tokenizer), float32 on the CPU, full fine-tuning, no gradient checkpointing. Data:
``shapes_vqa`` train questions of the ``count`` task (one 32 px image + "How many shapes are
there?"), rewarded by mmrl's ``counting`` reward (on the TRL side the same ``Reward`` object is
called on TRL's decoded completions with ``meta = [{"answer": ...}]``).

One step, on each side, is exactly: chat-template + process P prompts x G copies (P * G images),
sample P * G completions with Hugging Face ``generate`` (``max_new_tokens``, temperature, top_p 1,
top_k off), decode + score them, group-normalised advantages (GRPO: (r - mean) / std within each
group of G), one teacher-forced forward + backward over the whole batch (PPO-clip 0.2 surrogate,
token-mean loss = TRL's ``dapo``; the old log-probs are the sampling ones, so no extra forward on
either side: mmrl reads them from generate's logits, TRL detaches the current ones because it is
fully on-policy), gradient-norm clip 1.0 and ONE Adam step (1 epoch, 1 minibatch = the whole batch;
TRL: ``per_device_train_batch_size = P * G``, ``steps_per_generation = 1``, ``num_iterations = 1``,
``gradient_accumulation_steps = 1``). No KL / reference model (mmrl ``kl_coef = 0``, TRL
``beta = 0.0``), same learning rate (constant schedule on TRL), same Adam epsilon, no evaluation,
no checkpoint inside the timed loop.

Starting weights: a short SFT warm start (mmrl's own, ``--sft-steps``, outside the timing) made
once and loaded by both sides. Not from random weights, because then mmrl crashes within a few
steps: its HF engine does not suppress the ``<image>`` token while sampling (TRL passes
``suppress_tokens=[image_token_id]``), so a sampled ``<image>`` in a completion makes the
teacher-forced forward fail in Idefics3's ``inputs_merger`` ("Number of elements of source < number
of ones in mask"). The SFT'd model answers in ~2 tokens (digit + end of turn) on both sides, which
the table reports (``answer tok``) to show that the two sides did the same work.

Timing: each side runs in its own fresh subprocess (so imports, RNG and thread settings do not leak
between them) with the same ``torch.set_num_threads``; ``--warmup`` steps are dropped, the next
``--steps`` are averaged; ``--rounds`` repeats the pair, alternating which side goes first.
- mmrl: ``Trainer.run()`` as shipped (warm start off, tiny evaluations before / after the loop);
  ``step_s`` is the ``iter_s`` it logs (collect -> reward -> advantages -> update -> sync).
- TRL: ``GRPOTrainer.train()``; ``step_s`` is the wall time from the ``on_step_begin`` to the
  ``on_step_end`` callback (``_prepare_inputs``: generation + reward + advantages, then
  ``compute_loss`` + backward + clip + optimizer step).
- ``loop_s`` (both sides): wall time between the ends of consecutive steps, so everything a training
  loop does between steps (data loading, logging, callbacks) is counted too. mmrl's ``step_s``
  already includes its data fetch (simulator reset); TRL's excludes its dataloader, which only
  ``loop_s`` counts, so ``loop_s`` is the stricter like-for-like figure. Progress bars are off on
  both sides (``TQDM_DISABLE=1``, ``disable_tqdm=True``).

The last line is one JSON object ``{"mmrl_step_s", "trl_step_s", "ratio", ...}`` with ``ratio =
trl_step_s / mmrl_step_s`` (> 1: mmrl is faster; means over all timed steps of all rounds), the same
ratio of medians and of the fastest steps (``ratio_median``, ``ratio_min``: on a machine shared
with other work a slowed step inflates the mean, the fastest step is the least disturbed one), the
loop times and the settings.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAG = "VS_TRL_RESULT "


# ------------------------------------------------------------------------------------------ mmrl
def run_mmrl(a: argparse.Namespace) -> dict:
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(a.threads)
    from mmrl.experiment import build_trainer, load_experiment

    n = a.warmup + a.steps
    out = tempfile.mkdtemp(prefix="vs_trl_mmrl_")
    overrides = [
        f"run.output_dir={out}", "run.name=mmrl", f"run.threads={a.threads}", "run.seed=0", "run.device=cpu",
        "trainer.resume=false", "warm_start.dataset=null",  # no SFT here: the shared SFT weights load below
        f"sim.num_envs={a.prompts * a.group}", f"sim.eval_num_envs={a.group}",
        f"sim.kwargs.dataset_kwargs.num_samples={a.num_samples}",
        f"algorithm.group_size={a.group}", f"algorithm.minibatch_size={a.prompts * a.group}", "algorithm.epochs=1",
        "algorithm.kl_coef=0.0", "algorithm.objective=ppo", "algorithm.advantage=grpo",
        "algorithm.loss_agg=token-mean", "algorithm.clip_low=0.2", "algorithm.max_grad_norm=1.0",
        "algorithm.dynamic_sampling=false",
        "policy.model=tiny", "policy.tiny_seed=0", "policy.dtype=float32", "policy.engine=hf",
        f"policy.max_new_tokens={a.max_new_tokens}", f"policy.temperature={a.temperature}",
        "policy.top_p=1.0", "policy.top_k=0", "policy.finetune=full", "policy.gradient_checkpointing=false",
        f"trainer.lr={a.lr}", f"trainer.iterations={n}", "trainer.eval_every=0",
        f"trainer.eval_episodes={a.group}", "trainer.video_episodes=0", f"trainer.checkpoint_every={10**9}",
    ]
    cfg = load_experiment(ROOT / "configs/vlm_quickstart.yaml", overrides)
    trainer = build_trainer(cfg)
    if a.init:  # the shared starting weights (the SFT warm start made once by `run_sft`)
        trainer.policy.model.load_state_dict(torch.load(a.init, weights_only=True))

    tokens: list[float] = []  # mean completion length of each training rollout (same work check)
    prompt_len: list[int] = []
    rollout = trainer.policy.rollout

    def counted_rollout(obs, generator=None, mode="train"):
        batch = rollout(obs, generator=generator, mode=mode)
        if mode == "train":
            tokens.append(batch["completion_mask"].sum(1).float().mean().item())
            if not prompt_len:
                prompt_len.append(int(trainer.policy._cache[int(batch["uid"][0])]["prompt_ids"].shape[0]))
        return batch

    trainer.policy.rollout = counted_rollout
    ends: list[float] = []
    log = trainer.logger.log

    def timed_log(step, metrics):
        if "iter_s" in metrics:
            ends.append(time.perf_counter())
        return log(step, metrics)

    trainer.logger.log = timed_log
    trainer.run()
    rows = [json.loads(x) for x in (Path(out) / "mmrl" / "metrics.jsonl").read_text().splitlines()]
    step_s = [r["iter_s"] for r in rows if "iter_s" in r]
    shutil.rmtree(out, ignore_errors=True)
    return {"step_s": step_s[a.warmup:], "loop_s": [t1 - t0 for t0, t1 in zip(ends, ends[1:])][a.warmup - 1:]
            if a.warmup else [t1 - t0 for t0, t1 in zip(ends, ends[1:])],
            "completion_tokens": tokens[a.warmup:], "prompt_tokens": prompt_len[0] if prompt_len else None,
            "torch_threads": torch.get_num_threads()}


def run_sft(a: argparse.Namespace) -> dict:
    """mmrl's supervised warm start of the quickstart (shortened), saved to ``a.init`` for both sides."""
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(a.threads)
    from mmrl.experiment import build_trainer, load_experiment

    out = tempfile.mkdtemp(prefix="vs_trl_sft_")
    cfg = load_experiment(ROOT / "configs/vlm_quickstart.yaml", [
        f"run.output_dir={out}", "run.name=sft", f"run.threads={a.threads}", "trainer.resume=false",
        f"warm_start.steps={a.sft_steps}", f"warm_start.num_episodes={max(a.num_samples, 512)}",
        f"sim.num_envs={a.prompts * a.group}", f"sim.eval_num_envs={a.group}", f"algorithm.group_size={a.group}",
        f"sim.kwargs.dataset_kwargs.num_samples={a.num_samples}", "policy.model=tiny", "policy.tiny_seed=0"])
    trainer = build_trainer(cfg)
    t0 = time.time()
    trainer.warm_start()
    torch.save(trainer.policy.model.state_dict(), a.init)
    shutil.rmtree(out, ignore_errors=True)
    return {"sft_s": time.time() - t0}


# ------------------------------------------------------------------------------------------- TRL
def run_trl(a: argparse.Namespace) -> dict:
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(a.threads)
    from mmrl.utils.compat import patch_torchvision

    patch_torchvision()  # this machine's torchvision wheel does not load against torch+cpu (see mmrl.utils.compat)
    import datasets  # Hugging Face datasets: the installed package wins over this repo's datasets/ folder
    from PIL import Image
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mmrl.data import load_dataset
    from mmrl.registry import REWARDS
    from mmrl.testing.tiny_models import tiny_image_text_model

    if not hasattr(datasets, "Dataset"):
        raise RuntimeError(f"`import datasets` found {datasets!r}, not Hugging Face datasets: "
                           "pip install datasets")
    model, processor = tiny_image_text_model(seed=0)  # the weights of mmrl's `policy.model: tiny`
    if a.init:  # the shared starting weights (the SFT warm start made once by `run_sft`)
        model.load_state_dict(torch.load(a.init, weights_only=True))
    model.train()
    data = load_dataset("shapes_vqa", num_samples=a.num_samples, split="train", tasks=["count"])
    rows = [{"prompt": [{"role": "user", "content": q}],
             "image": Image.fromarray(imgs[0].numpy()), "answer": str(m["answer"])}
            for q, imgs, m in zip(data["prompt"], data["images"], data["meta"])]
    train = datasets.Dataset.from_list(rows)

    counting = REWARDS.build("counting")

    def counting_reward(prompts, completions, answer, **kwargs):
        texts = []
        for c in completions:
            if isinstance(c, list):  # conversational: [{"role": "assistant", "content": ...}]
                content = c[-1]["content"]
                content = content if isinstance(content, str) else "".join(
                    p.get("text", "") for p in content if isinstance(p, dict))
                texts.append(content)
            else:
                texts.append(c)
        return counting(texts, [""] * len(texts), [{"answer": x} for x in answer]).tolist()

    counting_reward.__name__ = "counting"

    class Timer(TrainerCallback):
        def __init__(self):
            self.t0, self.step_s, self.ends, self.logs = 0.0, [], [], []

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            now = time.perf_counter()
            self.step_s.append(now - self.t0)
            self.ends.append(now)

        def on_log(self, args, state, control, logs=None, **kw):
            self.logs.append(dict(logs or {}))

    out = tempfile.mkdtemp(prefix="vs_trl_trl_")
    args = GRPOConfig(
        output_dir=out, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, seed=0,
        per_device_train_batch_size=a.prompts * a.group, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=a.group, num_iterations=1, max_steps=a.warmup + a.steps,
        max_completion_length=a.max_new_tokens, temperature=a.temperature, top_p=1.0, top_k=0,
        beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group", mask_truncated_completions=False,
        learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_epsilon=1e-6, max_grad_norm=1.0, optim="adamw_torch",
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, log_completions=False,
        dataloader_num_workers=0,
    )
    timer = Timer()
    trainer = GRPOTrainer(model=model, reward_funcs=counting_reward, args=args, train_dataset=train,
                          processing_class=processor, callbacks=[timer])
    trainer.train()
    shutil.rmtree(out, ignore_errors=True)
    lens = [x["completions/mean_length"] for x in timer.logs if "completions/mean_length" in x]
    loop = [t1 - t0 for t0, t1 in zip(timer.ends, timer.ends[1:])]
    from trl.data_utils import prepare_multimodal_messages

    msgs = prepare_multimodal_messages(rows[0]["prompt"], images=[train[0]["image"]])
    sample = trainer._tokenize_prompts([msgs])  # (prompt_ids, images, multimodal fields)
    return {"step_s": timer.step_s[a.warmup:], "loop_s": loop[a.warmup - 1:] if a.warmup else loop,
            "completion_tokens": lens[a.warmup:], "prompt_tokens": len(sample[0][0]),
            "torch_threads": torch.get_num_threads()}


# ------------------------------------------------------------------------------------------ main
def child(side: str, a: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--side", side,
           *[f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items() if k not in ("side", "rounds")]]
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "MKL_NUM_THREADS": str(a.threads),
           "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [x for x in proc.stdout.splitlines() if x.startswith(TAG)]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"{side} run failed (exit {proc.returncode})")
    return json.loads(lines[-1][len(TAG):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--side", choices=["mmrl", "trl", "sft"], help=argparse.SUPPRESS)
    p.add_argument("--init", default="", help=argparse.SUPPRESS)
    p.add_argument("--prompts", type=int, default=8, help="P questions per step")
    p.add_argument("--group", type=int, default=8, help="G sampled answers per question")
    p.add_argument("--max-new-tokens", type=int, default=4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--num-samples", type=int, default=256, help="shapes_vqa train questions")
    p.add_argument("--warmup", type=int, default=1, help="steps dropped before timing")
    p.add_argument("--steps", type=int, default=8, help="timed steps per run")
    p.add_argument("--rounds", type=int, default=2, help="runs per side (alternating which goes first)")
    p.add_argument("--threads", type=int, default=1, help="torch threads on both sides")
    p.add_argument("--sft-steps", type=int, default=100,
                   help="mmrl SFT warm-start steps that make the shared starting weights (0: random weights)")
    a = p.parse_args()
    if a.side:
        res = {"mmrl": run_mmrl, "trl": run_trl, "sft": run_sft}[a.side](a)
        print(TAG + json.dumps(res), flush=True)
        return

    import importlib.metadata as md

    versions = {k: md.version(k) for k in ("torch", "transformers", "trl", "accelerate", "datasets")}
    if a.sft_steps:
        a.init = str(Path(tempfile.mkdtemp(prefix="vs_trl_init_")) / "init.pt")
        print(f"SFT warm start ({a.sft_steps} steps, mmrl) -> shared starting weights: "
              f"{child('sft', a)['sft_s']:.0f} s", flush=True)
    runs: dict[str, list[dict]] = {"mmrl": [], "trl": []}
    for r in range(a.rounds):
        for side in (("mmrl", "trl") if r % 2 == 0 else ("trl", "mmrl")):
            t0 = time.time()
            res = child(side, a)
            runs[side].append(res)
            print(f"round {r + 1} {side:4s}: step {statistics.mean(res['step_s']):.3f} s "
                  f"(steps {', '.join(f'{x:.3f}' for x in res['step_s'])}), run {time.time() - t0:.0f} s",
                  flush=True)

    if a.init:
        shutil.rmtree(Path(a.init).parent, ignore_errors=True)

    def agg(side: str, key: str) -> list[float]:
        return [x for res in runs[side] for x in res[key]]

    stats = {}
    for side in ("mmrl", "trl"):
        st, lp, tok = agg(side, "step_s"), agg(side, "loop_s"), agg(side, "completion_tokens")
        stats[side] = {"step": statistics.mean(st), "step_med": statistics.median(st), "step_min": min(st),
                       "step_sd": statistics.stdev(st) if len(st) > 1 else 0.0,
                       "loop": statistics.mean(lp) if lp else float("nan"), "n": len(st),
                       "tokens": statistics.mean(tok) if tok else float("nan"),
                       "prompt_tokens": runs[side][0]["prompt_tokens"]}
    m, t = stats["mmrl"], stats["trl"]
    print(f"\nGRPO step on CPU, tiny SmolVLM (Idefics3), {a.prompts} prompts x {a.group} answers, "
          f"max_new_tokens {a.max_new_tokens}, {a.threads} torch thread(s), {versions}")
    print(f"{'':6s} {'step s (mean)':>14s} {'median':>8s} {'min':>7s} {'sd':>7s} {'loop s':>8s} {'steps':>6s} "
          f"{'answer tok':>11s} {'prompt tok':>11s}")
    for side, s in (("mmrl", m), ("trl", t)):
        print(f"{side:6s} {s['step']:14.3f} {s['step_med']:8.3f} {s['step_min']:7.3f} {s['step_sd']:7.3f} {s['loop']:8.3f} "
              f"{s['n']:6d} {s['tokens']:11.2f} {str(s['prompt_tokens']):>11s}")
    print(f"ratio trl/mmrl: step {t['step'] / m['step']:.2f}x, loop {t['loop'] / m['loop']:.2f}x")
    print(json.dumps({
        "mmrl_step_s": round(m["step"], 4), "trl_step_s": round(t["step"], 4),
        "ratio": round(t["step"] / m["step"], 3), "ratio_median": round(t["step_med"] / m["step_med"], 3),
        "mmrl_step_min_s": round(m["step_min"], 4), "trl_step_min_s": round(t["step_min"], 4),
        "ratio_min": round(t["step_min"] / m["step_min"], 3),
        "mmrl_loop_s": round(m["loop"], 4), "trl_loop_s": round(t["loop"], 4),
        "loop_ratio": round(t["loop"] / m["loop"], 3),
        "mmrl_completion_tokens": round(m["tokens"], 3), "trl_completion_tokens": round(t["tokens"], 3),
        "settings": {"prompts": a.prompts, "group": a.group, "max_new_tokens": a.max_new_tokens,
                     "temperature": a.temperature, "lr": a.lr, "warmup": a.warmup, "steps": a.steps,
                     "rounds": a.rounds, "threads": a.threads, "sft_steps": a.sft_steps, "dtype": "float32", "device": "cpu",
                     "model": "tiny Idefics3 (mmrl.testing.tiny_models, seed 0)", **versions},
    }))


if __name__ == "__main__":
    main()
