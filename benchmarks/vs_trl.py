"""mmrl vs TRL: time of one GRPO step doing identical work on the same tiny VLM (CPU).

    .venv/bin/pip install -e ".[vlm,bench]"          # TRL is a benchmark-only dependency
    python benchmarks/vs_trl.py                    # 8 prompts x 8 answers of 4 tokens, 1 + 8 steps, 5 repeats
    python benchmarks/vs_trl.py --repeats 2 --steps 3 --sft-steps 10     # a quick check of the plumbing
    python benchmarks/vs_trl.py --smoke                                   # seconds: 2 x 2 answers, 1 repeat

Both sides train the same model, ``mmrl.tiny.tiny_models.tiny_image_text_model(seed=0)`` (a
real ``Idefics3ForConditionalGeneration`` + ``Idefics3Processor``: the SmolVLM architecture, random
weights, offline tokenizer), float32 on the CPU, full fine-tuning, no gradient checkpointing, from
the same starting weights (a short mmrl SFT warm start, ``--sft-steps``, made once outside the
timing). The work is made identical, and what can be counted is counted on both sides:

- records: the same ``shapes_vqa`` train questions (``count`` and ``color``, one 32 px image each)
  in the same order: step t of both sides answers the questions mmrl's `QASim` deals at iteration t
  (TRL gets them as an ordered dataset, ``shuffle_dataset=False``); each side notes the dataset
  indices its reward scores at every step and ``identical_records`` compares them;
- reward: the same ``short_answer`` `Reward` (built by mmrl's registry with the same arguments, in
  each side's process); mmrl's reward stage calls it, TRL calls it through a reward function;
- completion length: forced, ``min_new_tokens = max_new_tokens`` on both sides (mmrl: the model's
  ``generation_config``; TRL: ``generation_kwargs``), and the generated tokens are counted on both
  sides by the same wrapper around ``model.generate`` (completion tokens up to and including a stop
  token): ``*_tokens_per_step`` must be equal, P * G * max_new_tokens;
- prompts: the same wrapper counts the prompt tokens every completion was sampled from (padding
  excluded, the image tokens included: ``*_prompt_tokens_per_step``) and hashes their token ids per
  step, so ``identical_prompts`` says both sides' chat templates and processors made the same
  prompts; ``*_train_tokens_per_step`` counts the tokens of the loss's forward pass with gradients
  (prompts + completions) through the transformer below the LM head;
- optimizer steps: one Adam step per GRPO step (mmrl: 1 epoch, 1 minibatch = the whole batch; TRL:
  ``per_device_train_batch_size = P * G``, ``steps_per_generation = num_iterations = 1``), counted
  on both sides by a global torch optimizer-step hook;
- the same sampling (temperature, top_p 1, top_k off, image tokens suppressed), PPO-clip 0.2
  token-mean loss (TRL ``dapo``), no KL / reference model, gradient-norm clip 1.0, learning rate
  (constant), Adam epsilon, torch threads (``torch.set_num_threads`` and OMP / MKL variables).

One step on each side: chat-template + process the prompts, sample P * G completions with Hugging
Face ``generate``, decode + score, group-normalised advantages, one teacher-forced forward + backward
over the batch, clip, one optimizer step. mmrl: ``Trainer.run()`` as shipped (``step_s`` = the
``iter_s`` it logs); TRL: ``GRPOTrainer.train()`` (``step_s`` = ``on_step_begin`` to ``on_step_end``;
its dataloader is outside it). ``loop_s`` (both): time between the ends of consecutive steps, so
everything a loop does between steps counts: the like-for-like figure. The first ``--warmup``
steps are dropped on both sides.

Repeats: ``--repeats`` (>= 5 for a figure) pairs of fresh subprocesses, alternating which side
goes first. Per repeat and side the mean over the timed steps; the figures are the medians over the
repeats and ``ratio_* = trl / mmrl`` of them (> 1: mmrl is faster). ``identical_work`` is true when
every timed step of every repeat had the same records, prompt token ids and counts on both sides.
The last line is one JSON object with those, the per-repeat values, the counts per step, the load
average before and after, the settings and the versions. Timings need a quiet machine; the load average is
printed so a busy one shows.
"""

from __future__ import annotations

import argparse
import hashlib
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
TASKS = ["count", "color"]
COUNTS = ("tokens", "prompt_tokens", "train_tokens", "optimizer_steps")  # `Counters.counts`, per step


def data_kwargs(a: argparse.Namespace) -> dict:
    """The `QASim` arguments both sides take their questions from (the reward: `REWARD`)."""
    return {"dataset": "shapes_vqa", "dataset_kwargs": {"num_samples": a.num_samples, "tasks": TASKS}}


# ---------------------------------------------------------------------------------- counting
class Counters:
    """What each side did so far, snapshotted at the end of every step: ``counts`` (generated
    ``tokens``, ``prompt_tokens`` sampled from, ``train_tokens`` of the loss's forward passes,
    ``optimizer_steps``) and the digest of the prompt token ids of the step."""

    def __init__(self):
        self.counts = dict.fromkeys(("tokens", "prompt_tokens", "train_tokens", "optimizer_steps"), 0)
        self.prompts = hashlib.sha256()  # the prompts sampled from since the last step end
        self.ends: list[tuple[float, dict, str]] = []  # (time, counts, prompt digest) at each step end

    def count_generate(self, model, stop_ids: list[int]) -> None:
        """Wrap ``model.generate``: count each row's completion length (up to and including the first
        stop token; the whole width when there is none) as ``tokens``, and the prompt it was sampled
        from (its token ids without the padding, image tokens included; a prompt sampled n times counts
        n times) as ``prompt_tokens`` and in the digest of the step's prompts."""
        import torch

        generate, stops = model.generate, torch.tensor(stop_ids)

        def counted(*args, **kw):
            out = generate(*args, **kw)
            seqs = out.sequences if hasattr(out, "sequences") else out
            ids, mask = kw["input_ids"].cpu(), kw["attention_mask"].cpu().bool()
            rows = [ids[r][mask[r]].tolist() for r in range(ids.shape[0]) for _ in range(seqs.shape[0] // ids.shape[0])]
            self.counts["prompt_tokens"] += sum(map(len, rows))
            for row in sorted(rows):  # the digest of the multiset: the order of rows within a step is free
                self.prompts.update(json.dumps(row).encode())
            new = seqs[:, ids.shape[1] :].cpu()
            is_stop = torch.isin(new, stops)
            first = torch.where(is_stop.any(1), is_stop.float().argmax(1) + 1, torch.full_like(new[:, 0], new.shape[1]))
            self.counts["tokens"] += int(first.sum())
            return out

        model.generate = counted

    def count_train_forward(self, model) -> None:
        """Count the tokens (attention mask) of every forward pass with gradients through ``model``'s
        transformer (``model.model``, below the LM head: mmrl calls it directly, TRL through
        ``model``), the loss's teacher-forced pass over prompts and completions, as ``train_tokens``
        (a pre-hook: ``generate`` reads the signature of ``forward``, which a wrapper would hide)."""
        import torch

        def count(module, args, kwargs):
            if torch.is_grad_enabled():
                self.counts["train_tokens"] += int(kwargs["attention_mask"].sum())

        model.model.register_forward_pre_hook(count, with_kwargs=True)

    def count_optimizer_steps(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        def step(*_):
            self.counts["optimizer_steps"] += 1

        register_optimizer_step_post_hook(step)

    def step_end(self) -> None:
        self.ends.append((time.perf_counter(), dict(self.counts), self.prompts.hexdigest()))
        self.prompts = hashlib.sha256()

    def recording(self, reward):
        """``reward`` (a `mmrl.reward.Reward`, the same object: its kind, name and checks stay) noting the
        dataset index of every question it scores, one sorted list per call (per step): which records
        each step trained on. Nothing is noted while ``self.paused`` (mmrl's held-out evaluations)."""
        self.questions: list[list[int]] = []
        self.paused = False
        score = reward.score

        def scored(completions, prompts, meta):
            if not self.paused:
                self.questions.append(sorted(int(m["index"]) for m in meta))
            return score(completions, prompts, meta)

        reward.score = scored
        return reward

    def per_step(self, warmup: int) -> dict:
        """Timed steps (after ``warmup``): loop_s, each count and the prompt digest of each step, from
        the differences between consecutive step ends; the questions of every step."""
        pairs = list(zip(self.ends, self.ends[1:]))[max(warmup - 1, 0) :]
        return {
            "loop_s": [b[0] - a[0] for a, b in pairs],
            **{k: [b[1][k] - a[1][k] for a, b in pairs] for k in self.counts},
            "prompts": [b[2] for _, b in pairs],
            "questions": self.questions,
        }


def stop_ids(model, processor) -> list[int]:
    from mmrl.engines.hf_engine import stop_token_ids

    return stop_token_ids(model, getattr(processor, "tokenizer", processor))


# ------------------------------------------------------------------------------------------ mmrl
def mmrl_overrides(a: argparse.Namespace, out: str, name: str) -> list[str]:
    return [
        f"run.output_dir={out}",
        f"run.name={name}",
        f"run.threads={a.threads}",
        "run.seed=0",
        "run.device=cpu",
        "trainer.resume=false",
        f"sim.num_envs={a.prompts * a.group}",
        f"sim.eval_num_envs={a.group}",
        f"sim.kwargs.dataset_kwargs={{num_samples: {a.num_samples}, tasks: [{', '.join(TASKS)}]}}",
        "reward.type=short_answer",
        f"algorithm.group_size={a.group}",
        "policy.model=tiny",
        "policy.tiny_seed=0",
        "policy.dtype=float32",
        "policy.engine=hf",
    ]


def run_mmrl(a: argparse.Namespace) -> dict:
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(a.threads)
    from mmrl.experiment import build_trainer, load_experiment

    out = tempfile.mkdtemp(prefix="vs_trl_mmrl_")
    cfg = load_experiment(
        ROOT / "configs/vlm_quickstart.yaml",
        mmrl_overrides(a, out, "mmrl")
        + [
            "warm_start.dataset=null",  # no SFT here: the shared SFT weights load below
            f"algorithm.minibatch_size={a.prompts * a.group}",
            "algorithm.epochs=1",
            "algorithm.kl_coef=0.0",
            "algorithm.objective=ppo",
            "algorithm.advantage=grpo",
            "algorithm.loss_agg=token-mean",
            "algorithm.clip_low=0.2",
            "algorithm.max_grad_norm=1.0",
            "algorithm.dynamic_sampling=false",
            f"policy.max_new_tokens={a.max_new_tokens}",
            f"policy.temperature={a.temperature}",
            "policy.top_p=1.0",
            "policy.top_k=0",
            "policy.finetune=full",
            "policy.gradient_checkpointing=false",
            f"trainer.lr={a.lr}",
            "trainer.lr_schedule=constant",
            f"trainer.iterations={a.warmup + a.steps}",
            "trainer.eval_every=0",
            f"trainer.eval_episodes={a.group}",
            "trainer.video_episodes=0",
            f"trainer.checkpoint_every={10**9}",
        ],
    )
    trainer = build_trainer(cfg)
    model = trainer.policy.model
    model.load_state_dict(torch.load(a.init, weights_only=True))
    model.generation_config.min_new_tokens = a.max_new_tokens  # forced completion length
    counters = Counters()
    counters.count_generate(model, stop_ids(model, trainer.policy.processor))
    counters.count_train_forward(model)
    counters.count_optimizer_steps()
    counters.recording(trainer.reward_stage.model)  # called with meta
    evaluate = trainer.evaluate

    def unrecorded_evaluate(name):  # held-out questions at the start and the end: not training records
        counters.paused = True
        try:
            return evaluate(name)
        finally:
            counters.paused = False

    trainer.evaluate = unrecorded_evaluate
    log = trainer.logger.log

    def timed_log(step, metrics):
        if "iter_s" in metrics:
            counters.step_end()
        return log(step, metrics)

    trainer.logger.log = timed_log
    trainer.run()
    rows = [json.loads(x) for x in (Path(out) / "mmrl" / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out, ignore_errors=True)
    return {
        "step_s": [r["iter_s"] for r in rows if "iter_s" in r][a.warmup :],
        **counters.per_step(a.warmup),
        "torch_threads": torch.get_num_threads(),
        "dtype": str(next(model.parameters()).dtype),
    }


def run_sft(a: argparse.Namespace) -> dict:
    """mmrl's supervised warm start of the quickstart (shortened), saved to ``a.init`` for both sides."""
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(a.threads)
    from mmrl.experiment import build_trainer, load_experiment

    out = tempfile.mkdtemp(prefix="vs_trl_sft_")
    cfg = load_experiment(
        ROOT / "configs/vlm_quickstart.yaml",
        mmrl_overrides(a, out, "sft")
        + [f"warm_start.steps={a.sft_steps}", f"warm_start.num_episodes={max(a.num_samples, 512)}"],
    )
    trainer = build_trainer(cfg)
    t0 = time.time()
    trainer.warm_start()
    torch.save(trainer.policy.model.state_dict(), a.init)
    shutil.rmtree(out, ignore_errors=True)
    return {"sft_s": time.time() - t0}


# ------------------------------------------------------------------------------------------- TRL
def completion_texts(completions: list) -> list[str]:
    """TRL completions (strings, or conversational ``[{"role": "assistant", "content": ...}]``) -> text."""
    texts = []
    for c in completions:
        if isinstance(c, list):
            content = c[-1]["content"]
            c = (
                content
                if isinstance(content, str)
                else "".join(p.get("text", "") for p in content if isinstance(p, dict))
            )
        texts.append(c)
    return texts


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

    from mmrl.registry import REWARDS
    from mmrl.tiny.tiny_models import tiny_image_text_model
    from simulators.qa import QASim

    if not hasattr(datasets, "Dataset"):
        raise RuntimeError(f"`import datasets` found {datasets!r}, not Hugging Face datasets: pip install datasets")
    model, processor = tiny_image_text_model(seed=0)  # the weights of mmrl's `policy.model: tiny`
    model.load_state_dict(torch.load(a.init, weights_only=True))
    model.train()
    # the questions mmrl's QASim deals, in its order: iteration t, group j -> reset seed t * P + j
    sim = QASim(num_envs=1, **data_kwargs(a))
    order = sim.question_index(list(range((a.warmup + a.steps) * a.prompts))).tolist()
    rows = [
        {
            "prompt": [{"role": "user", "content": sim.prompts[q]}],
            "image": Image.fromarray(sim.images[q][0].numpy()),
            "answer": sim.meta[q]["answer"],
            "index": sim.meta[q]["index"],
        }
        for q in order
    ]
    counters = Counters()
    counters.count_generate(model, stop_ids(model, processor))
    counters.count_train_forward(model)
    counters.count_optimizer_steps()
    # the Reward mmrl's reward stage calls (it reads meta["answer"])
    reward = counters.recording(REWARDS.build("short_answer"))

    def short_answer(prompts, completions, answer, index, **kwargs):
        meta = [{"answer": x, "index": i} for x, i in zip(answer, index)]
        return reward(completion_texts(completions), [""] * len(completions), meta).tolist()

    class Timer(TrainerCallback):
        def __init__(self):
            self.t0, self.step_s = 0.0, []

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            counters.step_end()
            self.step_s.append(counters.ends[-1][0] - self.t0)

    out = tempfile.mkdtemp(prefix="vs_trl_trl_")
    args = GRPOConfig(
        output_dir=out,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        seed=0,
        per_device_train_batch_size=a.prompts * a.group,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=a.group,
        num_iterations=1,
        max_steps=a.warmup + a.steps,
        shuffle_dataset=False,
        max_completion_length=a.max_new_tokens,
        generation_kwargs={"min_new_tokens": a.max_new_tokens},
        temperature=a.temperature,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        mask_truncated_completions=False,
        learning_rate=a.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_epsilon=1e-6,
        max_grad_norm=1.0,
        optim="adamw_torch",
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )
    timer = Timer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=short_answer,
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=processor,
        callbacks=[timer],
    )
    trainer.train()
    shutil.rmtree(out, ignore_errors=True)
    return {
        "step_s": timer.step_s[a.warmup :],
        **counters.per_step(a.warmup),
        "torch_threads": torch.get_num_threads(),
        "dtype": str(next(model.parameters()).dtype),
    }


# ------------------------------------------------------------------------------------------ main
def child(side: str, a: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--side",
        side,
        *[f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items() if k not in ("side", "repeats", "smoke")],
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(a.threads),
        "MKL_NUM_THREADS": str(a.threads),
        "TOKENIZERS_PARALLELISM": "false",
        "TQDM_DISABLE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [x for x in proc.stdout.splitlines() if x.startswith(TAG)]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"{side} run failed (exit {proc.returncode})")
    return json.loads(lines[-1][len(TAG) :])


def main() -> None:
    from _smoke import parse_args

    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--side", choices=["mmrl", "trl", "sft"], help=argparse.SUPPRESS)
    p.add_argument("--init", default="", help=argparse.SUPPRESS)
    p.add_argument("--prompts", type=int, default=8, help="P questions per step")
    p.add_argument("--group", type=int, default=8, help="G sampled answers per question")
    p.add_argument("--max-new-tokens", type=int, default=4, help="completion length (forced on both sides)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--num-samples", type=int, default=256, help="shapes_vqa train questions")
    p.add_argument("--warmup", type=int, default=1, help="steps dropped before timing (both sides)")
    p.add_argument("--steps", type=int, default=8, help="timed steps per run")
    p.add_argument("--repeats", type=int, default=5, help="runs per side, alternating which goes first (>= 5)")
    p.add_argument("--threads", type=int, default=1, help="torch threads on both sides")
    p.add_argument("--sft-steps", type=int, default=100, help="mmrl SFT steps that make the shared starting weights")
    a = parse_args(p, prompts=2, group=2, num_samples=32, steps=1, repeats=1, sft_steps=2)
    if a.side:
        res = {"mmrl": run_mmrl, "trl": run_trl, "sft": run_sft}[a.side](a)
        print(TAG + json.dumps(res), flush=True)
        return
    if a.warmup < 1 or a.steps < 1 or a.repeats < 1 or a.sft_steps < 1:
        p.error("--warmup, --steps, --repeats and --sft-steps must be >= 1")
    if a.repeats < 5:
        print(f"note: {a.repeats} repeats: a check of the plumbing, not a figure (use >= 5)", flush=True)

    import importlib.metadata as md

    versions = {k: md.version(k) for k in ("torch", "transformers", "trl", "accelerate", "datasets")}
    load_before = os.getloadavg()
    a.init = str(Path(tempfile.mkdtemp(prefix="vs_trl_init_")) / "init.pt")
    print(
        f"SFT warm start ({a.sft_steps} steps, mmrl) -> shared starting weights: {child('sft', a)['sft_s']:.0f} s",
        flush=True,
    )
    runs: dict[str, list[dict]] = {"mmrl": [], "trl": []}
    for r in range(a.repeats):
        for side in ("mmrl", "trl") if r % 2 == 0 else ("trl", "mmrl"):
            res = child(side, a)
            runs[side].append(res)
            print(
                f"repeat {r + 1} {side:4s}: step {statistics.fmean(res['step_s']):.3f} s, loop "
                f"{statistics.fmean(res['loop_s']):.3f} s, tokens/step {res['tokens']}, optimizer steps/step "
                f"{res['optimizer_steps']}, load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    shutil.rmtree(Path(a.init).parent, ignore_errors=True)
    load_after = os.getloadavg()

    fig: dict = {}
    for side, res in runs.items():
        step = [statistics.fmean(x["step_s"]) for x in res]  # per repeat: mean over its timed steps
        loop = [statistics.fmean(x["loop_s"]) for x in res]
        fig[side] = {
            "step_s": statistics.median(step),
            "loop_s": statistics.median(loop),
            "step_repeats": step,
            "loop_repeats": loop,
            "dtype": res[0]["dtype"],
            "torch_threads": res[0]["torch_threads"],
        }
        for key in COUNTS:  # per timed step, over every repeat
            values = [v for x in res for v in x[key]]
            fig[side][f"{key}_per_step"] = statistics.fmean(values)
            fig[side][f"{key}_min_max"] = [min(values), max(values)]
    m, t = fig["mmrl"], fig["trl"]
    print(
        f"\nGRPO step on CPU, tiny SmolVLM (Idefics3), {a.prompts} prompts x {a.group} answers of exactly "
        f"{a.max_new_tokens} tokens, {a.threads} torch thread(s), {a.repeats} repeats x {a.steps} timed steps, "
        f"{versions}"
    )
    print(
        f"{'':6s} {'step s':>8s} {'loop s':>8s}"
        + "".join(f" {k + '/step':>20s}" for k in COUNTS)
        + "  (step and loop: medians over repeats of the per-repeat means)"
    )
    for side, s in (("mmrl", m), ("trl", t)):
        print(
            f"{side:6s} {s['step_s']:8.3f} {s['loop_s']:8.3f}" + "".join(f" {s[k + '_per_step']:20.1f}" for k in COUNTS)
        )
    same_records = all(x["questions"] == y["questions"] for x, y in zip(runs["mmrl"], runs["trl"]))
    same_prompts = all(x["prompts"] == y["prompts"] for x, y in zip(runs["mmrl"], runs["trl"]))
    same_counts = all(x[k] == y[k] for x, y in zip(runs["mmrl"], runs["trl"]) for k in COUNTS)
    same = same_records and same_prompts and same_counts
    print(
        f"ratio trl/mmrl: step {t['step_s'] / m['step_s']:.2f}x, loop {t['loop_s'] / m['loop_s']:.2f}x; identical "
        f"work (records, prompt token ids, {', '.join(COUNTS)} of every step): {same} (records {same_records}, "
        f"prompt ids {same_prompts}, counts {same_counts}); load average {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after"
    )
    r4 = lambda xs: [round(x, 4) for x in xs]  # noqa: E731
    print(
        json.dumps(
            {
                **{f"{side}_{k}_per_step": fig[side][f"{k}_per_step"] for k in COUNTS for side in ("mmrl", "trl")},
                "identical_records": same_records,
                "identical_prompts": same_prompts,
                "identical_counts": same_counts,
                "identical_work": same,
                "mmrl_step_s": round(m["step_s"], 4),
                "trl_step_s": round(t["step_s"], 4),
                "ratio_step": round(t["step_s"] / m["step_s"], 3),
                "mmrl_loop_s": round(m["loop_s"], 4),
                "trl_loop_s": round(t["loop_s"], 4),
                "ratio_loop": round(t["loop_s"] / m["loop_s"], 3),
                "mmrl_step_s_repeats": r4(m["step_repeats"]),
                "trl_step_s_repeats": r4(t["step_repeats"]),
                "mmrl_loop_s_repeats": r4(m["loop_repeats"]),
                "trl_loop_s_repeats": r4(t["loop_repeats"]),
                "load_average": {
                    "before": [round(x, 2) for x in load_before],
                    "after": [round(x, 2) for x in load_after],
                },
                "settings": {
                    "prompts": a.prompts,
                    "group": a.group,
                    "max_new_tokens": a.max_new_tokens,
                    "min_new_tokens": a.max_new_tokens,
                    "tasks": TASKS,
                    "reward": "short_answer",
                    "temperature": a.temperature,
                    "lr": a.lr,
                    "warmup": a.warmup,
                    "steps": a.steps,
                    "repeats": a.repeats,
                    "threads": a.threads,
                    "sft_steps": a.sft_steps,
                    "dtype": {"mmrl": m["dtype"], "trl": t["dtype"]},
                    "device": "cpu",
                    "model": "tiny Idefics3 (mmrl.tiny.tiny_models, seed 0)",
                    **versions,
                },
            }
        )
    )


if __name__ == "__main__":
    main()
