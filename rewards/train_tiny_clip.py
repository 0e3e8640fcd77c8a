"""Train a tiny open_clip CLIP on the `reach_clip` frames so its contrasting-goal reward
(`rewards.clip_goal.CLIPContrastGoal`) says whether the gripper is at the instructed target.

The model is a real ``open_clip.model.CLIP`` with tiny dimensions (`REACH_CLIP_CONFIG`: a 2-layer
ViT on 4 px patches of the 32 px frames, a 1-layer text transformer, 64-d embeddings). Training is
contrastive over goal captions: for every image and every palette colour ``c`` the image has to
pick, between the positive caption ``"the gripper is on the {c} target"`` and the negative caption
``"the gripper is far from the {c} target"``, the one that describes it. That is a two-way InfoNCE in
the text direction, i.e. a logistic loss on ``logit_scale * (cos(I, pos_c) - cos(I, neg_c))``, which is
exactly the contrast the CLG reward thresholds. Targets are soft: 1 within the success radius of
the disc of colour ``c``, falling linearly to 0 at ``soft_radius`` (0 for colours not in the scene),
so the reward also grades "near the target". The logit scale is fixed (``logit_scale``), so a
trained model's contrast ``c_pos - c_neg`` has a known scale: the reward window ``t_min = -w``,
``t_max = w`` with ``w = 3 / logit_scale`` (`reward_window`) maps probabilities 5 %..95 % to
rewards 0..1.

``train_tiny_clip(data, out_dir)`` trains for ``steps`` (400 steps of 256 frames, ~45-60 s on one
busy CPU core; ``time_limit_s`` only stops a run on a far slower machine early) and saves the
model in open_clip's ``local-dir`` layout (``open_clip_config.json`` + ``open_clip_pytorch_model.bin``
+ ``train_info.json``), so any CLIP reward loads it with ``model_name="local-dir:<out_dir>"`` and
``pretrained=None``. `goal_reward_stats` measures how the reward correlates with success.

    python rewards/train_tiny_clip.py --out runs/reach_clip      # 20k frames, < 1 min on one CPU core

Use one torch thread on small shared CPUs (the default of the script and the benchmark): with two
threads competing with other processes the same training ran ~10x slower here.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rewards.clip_score import OPENAI_MEAN, OPENAI_STD, clip_pixels  # noqa: E402

REACH_CLIP_CONFIG = {
    "embed_dim": 64,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 4},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
POSITIVE = "the gripper is on the {color} target"
NEGATIVE = "the gripper is far from the {color} target"


def reward_window(logit_scale: float) -> tuple[float, float]:
    """``(t_min, t_max)`` of `contrast_goal_reward` for a model trained at ``logit_scale``."""
    w = 3.0 / float(logit_scale)
    return -w, w


def soft_targets(color_distance: torch.Tensor, radius: float, soft_radius: float) -> torch.Tensor:
    """``[M, P]`` targets: 1 within ``radius``, linear to 0 at ``soft_radius`` (inf distance -> 0)."""
    if soft_radius <= radius:
        return (color_distance <= radius).float()
    t = (soft_radius - color_distance) / (soft_radius - radius)
    return t.clamp(0.0, 1.0).nan_to_num(0.0)


def build_model(config: dict | None = None, seed: int = 0):
    """A fresh ``open_clip.model.CLIP`` of ``config`` (default `REACH_CLIP_CONFIG`) and its tokenizer."""
    from rewards.clip_score import import_open_clip

    open_clip = import_open_clip()
    cfg = json.loads(json.dumps(config or REACH_CLIP_CONFIG))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = open_clip.model.CLIP(**cfg)
    tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=cfg["text_cfg"]["context_length"])
    return model, tokenizer, cfg


def save_model(model, cfg: dict, out_dir: str | Path, info: dict) -> Path:
    """open_clip ``local-dir`` layout: load with ``open_clip.create_model("local-dir:" + out_dir)``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    preprocess = {"size": cfg["vision_cfg"]["image_size"], "mean": list(OPENAI_MEAN), "std": list(OPENAI_STD),
                  "interpolation": "bicubic", "resize_mode": "shortest"}
    (out / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": preprocess}, indent=2))
    torch.save(model.state_dict(), out / "open_clip_pytorch_model.bin")
    (out / "train_info.json").write_text(json.dumps(info, indent=2))
    return out


def load_model(out_dir: str | Path):
    """``(model, tokenizer)`` saved by `save_model` (eval mode, CPU)."""
    from rewards.clip_score import import_open_clip

    open_clip = import_open_clip()
    name = f"local-dir:{Path(out_dir)}"
    return open_clip.create_model(name).eval(), open_clip.get_tokenizer(name)


def train_tiny_clip(
    data: dict,
    out_dir: str | Path | None = None,
    steps: int = 400,
    batch_size: int = 256,
    lr: float = 2e-3,
    weight_decay: float = 0.05,
    logit_scale: float = 20.0,
    soft_radius: float = 0.25,
    time_limit_s: float = 90.0,
    seed: int = 0,
    config: dict | None = None,
    log_every: int = 100,
) -> tuple[Any, dict]:
    """Train on `reach_clip` frames (``image``, ``color_distance``, ``colors``, ``meta.success_radius``).

    Returns ``(model, info)`` (model in eval mode); with ``out_dir`` also saves it (`save_model`).
    ``info``: steps, wall_s, final loss, logit_scale, soft_radius, the reward window
    (``t_min`` / ``t_max``) and the caption templates.
    """
    model, tokenizer, cfg = build_model(config, seed)
    colors = list(data["colors"])
    radius = float(data["meta"]["success_radius"])
    texts = [POSITIVE.format(color=c) for c in colors] + [NEGATIVE.format(color=c) for c in colors]
    tokens = tokenizer(texts)
    targets_all = soft_targets(data["color_distance"].float(), radius, soft_radius)  # [M, P]
    images = data["image"]
    m, p = images.shape[0], len(colors)
    spec = (cfg["vision_cfg"]["image_size"], (cfg["vision_cfg"]["image_size"],) * 2, OPENAI_MEAN, OPENAI_STD)
    pixels_all = clip_pixels(images, *spec)  # preprocessed once: [M, 3, S, S]
    decay = [p_ for n, p_ in model.named_parameters() if p_.dim() >= 2 and "embedding" not in n]
    rest = [p_ for n, p_ in model.named_parameters() if not (p_.dim() >= 2 and "embedding" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    gen = torch.Generator().manual_seed(seed)
    model.train()
    t0, step, losses = time.time(), 0, []
    for step in range(1, steps + 1):
        idx = torch.randint(0, m, (batch_size,), generator=gen)
        img = F.normalize(model.encode_image(pixels_all[idx]), dim=-1)  # [B, D]
        txt = F.normalize(model.encode_text(tokens), dim=-1)  # [2P, D]
        sim = img @ txt.T  # [B, 2P]
        logits = logit_scale * (sim[:, :p] - sim[:, p:])  # pos vs neg caption, per colour
        loss = F.binary_cross_entropy_with_logits(logits, targets_all[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if log_every and step % log_every == 0:
            print(f"[tiny clip] step {step} loss {sum(losses[-log_every:]) / log_every:.4f} "
                  f"({time.time() - t0:.0f} s)", flush=True)
        if time.time() - t0 > time_limit_s:
            break
    model.eval()
    t_min, t_max = reward_window(logit_scale)
    info = {
        "steps": step, "wall_s": round(time.time() - t0, 1), "loss": sum(losses[-50:]) / len(losses[-50:]),
        "logit_scale": logit_scale, "soft_radius": soft_radius, "t_min": t_min, "t_max": t_max,
        "positive": POSITIVE, "negative": NEGATIVE, "samples": m, "colors": colors,
    }
    if out_dir is not None:
        save_model(model, cfg, out_dir, info)
    return model, info


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    den = (x.norm() * y.norm()).item()
    return float((x * y).sum().item() / den) if den > 0 else 0.0


def _auc(score: torch.Tensor, label: torch.Tensor) -> float:
    """ROC AUC of ``score`` for binary ``label`` (ties count one half)."""
    pos, neg = score[label], score[~label]
    if pos.numel() == 0 or neg.numel() == 0:
        return float("nan")
    ranks = torch.empty_like(score, dtype=torch.float64)
    order = score.argsort()
    ranks[order] = torch.arange(1, score.numel() + 1, dtype=torch.float64)
    # average ranks of ties
    uniq, inv = torch.unique(score, return_inverse=True)
    sums = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inv, ranks)
    cnts = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inv, torch.ones_like(ranks))
    ranks = (sums / cnts)[inv]
    n_pos, n_neg = pos.numel(), neg.numel()
    return float((ranks[label].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


@torch.no_grad()
def goal_reward_stats(reward, data: dict, meta: list[dict] | None = None, batch_size: int = 1024) -> dict:
    """How an image reward (prompt = the frame's instruction; ``meta`` default: `goal_meta`) tracks
    being at the instructed target: Pearson correlation with success and with ``-goal_distance``, ROC
    AUC for success, the mean reward of success / failure frames and the accuracy of ``reward > 0.5``."""
    meta = goal_meta(data["instruction"]) if meta is None else meta
    scores = []
    for s in range(0, data["image"].shape[0], batch_size):
        sl = slice(s, s + batch_size)
        scores.append(reward(data["image"][sl], data["instruction"][sl], meta[sl]))
    r = torch.cat(scores).float()
    ok = data["success"].bool()
    return {
        "corr_success": round(_pearson(r, ok.float()), 4),
        "corr_neg_distance": round(_pearson(r, -data["goal_distance"].float().clamp(max=2.0)), 4),
        "auc_success": round(_auc(r, ok), 4),
        "mean_success": round(r[ok].mean().item(), 4) if ok.any() else float("nan"),
        "mean_failure": round(r[~ok].mean().item(), 4) if (~ok).any() else float("nan"),
        "accuracy": round(((r > 0.5) == ok).float().mean().item(), 4),
        "frames": int(r.numel()),
        "success_share": round(ok.float().mean().item(), 4),
    }


def goal_meta(instructions: list[str]) -> list[dict]:
    """Per instruction ``{"positive_goal", "negative_goal"}`` from its colour word (ReachSim palette)."""
    from simulators.reach import PALETTE

    out = []
    for text in instructions:
        color = next((w for w in text.split() if w in PALETTE), None)
        if color is None:
            raise ValueError(f"no colour word of the reach palette in instruction {text!r}")
        out.append({"positive_goal": POSITIVE.format(color=color), "negative_goal": NEGATIVE.format(color=color)})
    return out


def main() -> None:
    import argparse

    from mmrl.data import load_dataset

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/reach_clip")
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--time-limit", type=float, default=90.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 keeps torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    data = load_dataset("reach_clip", num_samples=args.samples, seed=args.seed)
    _, info = train_tiny_clip(data, args.out, steps=args.steps, time_limit_s=args.time_limit, seed=args.seed)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
