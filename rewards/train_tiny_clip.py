"""Pretrain a tiny open_clip CLIP on `reach_clip` (image, caption) pairs, the way CLIP is pretrained,
and measure its zero-shot contrasting-goal reward (`rewards.clip_goal.CLIPContrastGoal`).

Pretraining sees only the frames and their captions: absolute descriptions of the picture (which
colour of disc is in which cell of a coarse grid, which cell the gripper is in; `datasets/reach_clip`).
The loss is CLIP's symmetric InfoNCE over the batch (`clip_loss`): each image must pick its own
caption among the batch's captions and each caption its own image; the targets are the batch
indices, nothing else. No success flag, success radius, goal or goal distance exists in the
training data (``tests/rewards/test_reach_clip_pretraining.py`` checks it).

At RL time the reward is zero-shot: VLM-RL's contrasting goal texts (`GOAL_WORDINGS`, e.g.
"the gripper is on the red disc" vs "the gripper is far from the red disc", the colour read from
the instruction), sentences the model never saw. Which wording and which reward window
(``t_min`` / ``t_max``, `quantile_window`) to use is chosen on validation frames / episodes
(`select_goal_setting`), never on the held-out ones; `goal_reward_stats` measures how a setting
tracks success.

The model is a real ``open_clip.model.CLIP`` with tiny dimensions (`REACH_CLIP_CONFIG`: a 3-layer
ViT on 8 px patches of the 32 px frames, a 2-layer text transformer, 64-d embeddings) and CLIP's
learnable temperature. It is saved in open_clip's ``local-dir`` layout (``open_clip_config.json`` +
``open_clip_pytorch_model.bin`` + ``train_info.json``), so a reward loads it with
``model_name="local-dir:<out_dir>"`` and ``pretrained=None``.

    python -m rewards.train_tiny_clip --out runs/reach_clip      # 20k pairs, a few minutes on one CPU core

Use one torch thread on small shared CPUs (the default of the script and the benchmark).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmrl.algorithms.reward_audit import auc, pearson

from .clip_score import OPENAI_MEAN, OPENAI_STD, clip_pixels

REACH_CLIP_CONFIG = {
    "embed_dim": 64,
    "vision_cfg": {"image_size": 32, "layers": 3, "width": 48, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 40, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
#: contrasting goal texts (positive, negative), ``{color}`` from the instruction, chosen among on
#: validation episodes. Without reach_clip's relational captions none is a training caption; with
#: them "the gripper is on the red disc" is one (of frames whose gripper is on a red disc, whatever
#: the instruction). The first is the default of configs/quickstart_clip_reward.yaml.
GOAL_WORDINGS = (
    ("the gripper is on the {color} disc", "the gripper is far from the {color} disc"),
    ("the gripper is at the {color} disc", "the gripper is away from the {color} disc"),
    ("the {color} disc and the gripper", "the {color} disc. the gripper"),
    (
        "the {color} disc and the gripper are at the same place",
        "the {color} disc and the gripper are at different places",
    ),
    # VLM-RM's goal against a baseline that names the gripper alone (the goal's direction from it)
    ("the gripper is on the {color} disc", "the gripper"),
    ("the gripper is touching the {color} disc", "the gripper is far from the {color} disc"),
)
#: reward windows tried on validation: quantile pairs of ``d = c_neg - c_pos`` over validation frames
WINDOW_QUANTILES = ((0.05, 0.95), (0.2, 0.8), (0.05, 0.5), (0.5, 0.95))


# ----------------------------------------------------------------------------- model
def build_model(config: dict | None = None, seed: int = 0):
    """A fresh ``open_clip.model.CLIP`` of ``config`` (default `REACH_CLIP_CONFIG`) and its tokenizer."""
    from .clip_score import import_open_clip

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
    preprocess = {
        "size": cfg["vision_cfg"]["image_size"],
        "mean": list(OPENAI_MEAN),
        "std": list(OPENAI_STD),
        "interpolation": "bicubic",
        "resize_mode": "shortest",
    }
    (out / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": preprocess}, indent=2))
    torch.save(model.state_dict(), out / "open_clip_pytorch_model.bin")
    (out / "train_info.json").write_text(json.dumps(info, indent=2))
    return out


def load_model(out_dir: str | Path):
    """``(model, tokenizer)`` saved by `save_model` (eval mode, CPU)."""
    from .clip_score import import_open_clip

    open_clip = import_open_clip()
    name = f"local-dir:{Path(out_dir)}"
    return open_clip.create_model(name).eval(), open_clip.get_tokenizer(name)


# ----------------------------------------------------------------------------- pretraining
def tokenize_captions(captions: Sequence[Sequence[str]], tokenizer, context_length: int) -> torch.Tensor:
    """Token ids ``[M, P, L]`` of ``M`` frames' ``P`` captions; a caption longer than the context raises."""
    flat = [c for caps in captions for c in caps]
    longest = max(len(tokenizer.encode(c)) + 2 for c in set(flat))  # + start / end tokens
    if longest > context_length:
        raise ValueError(
            f"a caption has {longest} tokens but the text context is {context_length}: "
            "raise text_cfg.context_length or shorten the captions"
        )
    p = len(captions[0])
    if any(len(caps) != p for caps in captions):
        raise ValueError("every frame needs the same number of captions (one per phrasing)")
    return tokenizer(flat).view(len(captions), p, -1)


def batch_indices(num_frames: int, num_phrasings: int, batch_size: int, gen: torch.Generator):
    """One training batch: frame indices ``[B]`` and, per frame, the phrasing of its caption ``[B]``."""
    return (
        torch.randint(0, num_frames, (batch_size,), generator=gen),
        torch.randint(0, num_phrasings, (batch_size,), generator=gen),
    )


def clip_loss(image_emb: torch.Tensor, text_emb: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    """CLIP's symmetric InfoNCE over a batch of ``B`` matched pairs (row i of both is pair i):
    ``(CE(s * I T^T, arange) + CE(s * T I^T, arange)) / 2`` on unit embeddings ``[B, D]``."""
    img, txt = F.normalize(image_emb, dim=-1), F.normalize(text_emb, dim=-1)
    logits = logit_scale * img @ txt.T
    labels = torch.arange(img.shape[0], device=img.device)
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels))


def train_tiny_clip(
    data: dict,
    out_dir: str | Path | None = None,
    steps: int = 1200,
    batch_size: int = 128,
    lr: float = 1e-3,
    weight_decay: float = 0.05,
    time_limit_s: float = 900.0,
    seed: int = 0,
    config: dict | None = None,
    log_every: int = 250,
) -> tuple[Any, dict]:
    """Contrastive pretraining on ``data["image"]`` uint8 ``[M, H, W, 3]`` and ``data["captions"]``
    (M lists of P phrasings); no other key of ``data`` is read.

    Returns ``(model, info)`` (model in eval mode); with ``out_dir`` also saves it (`save_model`).
    ``info``: steps, wall_s, final loss and in-batch retrieval accuracy, logit scale, samples.
    """
    model, tokenizer, cfg = build_model(config, seed)
    images, captions = data["image"], data["captions"]
    if len(captions) != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {len(captions)} caption lists")
    tokens = tokenize_captions(captions, tokenizer, cfg["text_cfg"]["context_length"])  # [M, P, L]
    size = cfg["vision_cfg"]["image_size"]
    pixels = clip_pixels(images, size, (size, size), OPENAI_MEAN, OPENAI_STD)  # preprocessed once
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embedding" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embedding" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}], lr=lr
    )
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    gen = torch.Generator().manual_seed(seed)
    model.train()
    t0, step, losses, accs = time.time(), 0, [], []
    for step in range(1, steps + 1):
        frame, phrasing = batch_indices(images.shape[0], tokens.shape[1], batch_size, gen)
        img = model.encode_image(pixels[frame])
        txt = model.encode_text(tokens[frame, phrasing])
        loss = clip_loss(img, txt, model.logit_scale.exp())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))  # as CLIP
            accs.append((img @ txt.T).argmax(1).eq(torch.arange(batch_size)).float().mean().item())
        losses.append(loss.item())
        if log_every and step % log_every == 0:
            print(
                f"[tiny clip] step {step} loss {sum(losses[-log_every:]) / log_every:.4f} in-batch image->text "
                f"accuracy {sum(accs[-log_every:]) / log_every:.3f} ({time.time() - t0:.0f} s)",
                flush=True,
            )
        if time.time() - t0 > time_limit_s:
            break
    model.eval()
    tail = min(50, len(losses))
    info = {
        "steps": step,
        "wall_s": round(time.time() - t0, 1),
        "loss": round(sum(losses[-tail:]) / tail, 4),
        "batch_accuracy": round(sum(accs[-tail:]) / tail, 4),
        "logit_scale": round(model.logit_scale.exp().item(), 3),
        "samples": int(images.shape[0]),
        "batch_size": batch_size,
        "seed": seed,
    }
    if out_dir is not None:
        save_model(model, cfg, out_dir, info)
    return model, info


# ----------------------------------------------------------------------------- zero-shot goal reward
def goal_meta(instructions: Sequence[str], wording: tuple[str, str] = GOAL_WORDINGS[0]) -> list[dict]:
    """Per instruction ``{"positive_goal", "negative_goal"}`` from ``wording`` and its colour word."""
    from mmrl.registry import adapter

    PALETTE = adapter("simulators.reach").PALETTE

    out = []
    for text in instructions:
        color = next((w for w in text.split() if w in PALETTE), None)
        if color is None:
            raise ValueError(f"no colour word of the reach palette in instruction {text!r}")
        out.append({"positive_goal": wording[0].format(color=color), "negative_goal": wording[1].format(color=color)})
    return out


@torch.no_grad()
def goal_contrast(
    model,
    tokenizer,
    images: torch.Tensor,
    instructions: Sequence[str],
    wording: tuple[str, str],
    batch_size: int = 1024,
) -> torch.Tensor:
    """``d = c_neg - c_pos`` ``[B]`` of frames under a wording: what `CLIPContrastGoal` windows."""
    from .clip_goal import CLIPContrastGoal

    reward = CLIPContrastGoal(model=model, tokenizer=tokenizer, positive=None, negative=None, raw=True, device="cpu")
    meta = goal_meta(instructions, wording)
    out = [
        reward(images[s : s + batch_size], list(instructions[s : s + batch_size]), meta[s : s + batch_size])
        for s in range(0, images.shape[0], batch_size)
    ]
    return -torch.cat(out).float()  # raw is c_pos - c_neg


def quantile_window(d: torch.Tensor, lo: float, hi: float) -> tuple[float, float]:
    """``(t_min, t_max)``: the ``lo`` / ``hi`` quantiles of ``d`` (widened to a 1e-4 gap if equal)."""
    t_min, t_max = torch.quantile(d.double(), torch.tensor([lo, hi], dtype=torch.float64)).tolist()
    return t_min, max(t_max, t_min + 1e-4)


def select_goal_setting(
    d_by_wording: dict[int, torch.Tensor],
    success: torch.Tensor,
    quantiles: Sequence[tuple[float, float]] = WINDOW_QUANTILES,
) -> dict:
    """The (wording, window) whose windowed CLG reward correlates best with ``success`` on validation
    frames. ``d_by_wording``: wording index -> ``d`` ``[B]``. Returns the choice and every candidate's score."""
    from .clip_goal import contrast_goal_reward

    scores = []
    for w, d in d_by_wording.items():
        for lo, hi in quantiles:
            t_min, t_max = quantile_window(d, lo, hi)
            r = contrast_goal_reward(-d, torch.zeros_like(d), t_min, t_max)  # sim_pos - sim_neg = -d
            scores.append(
                {
                    "wording": w,
                    "quantiles": [lo, hi],
                    "t_min": t_min,
                    "t_max": t_max,
                    "corr_success": round(pearson(r, success.float()), 4),
                }
            )
    best = max(scores, key=lambda s: s["corr_success"])
    return {**best, "candidates": scores}


def reward_stats(reward: torch.Tensor, success: torch.Tensor, goal_distance: torch.Tensor | None = None) -> dict:
    """How a reward ``[N]`` tracks ``success`` ``[N]``: Pearson correlation (and with minus the goal
    distance when given), ROC AUC, mean reward of success / failure, success share."""
    r, ok = reward.float(), success.bool()
    out = {
        "corr_success": round(pearson(r, ok.float()), 4),
        "auc_success": round(auc(r, ok), 4),
        "mean_success": round(r[ok].mean().item(), 4) if ok.any() else None,
        "mean_failure": round(r[~ok].mean().item(), 4) if (~ok).any() else None,
        "n": int(r.numel()),
        "success_share": round(ok.float().mean().item(), 4),
    }
    if goal_distance is not None:
        out["corr_neg_distance"] = round(pearson(r, -goal_distance.float().clamp(max=2.0)), 4)
    return out


def goal_reward_stats(reward, data: dict, meta: list[dict] | None = None, batch_size: int = 1024) -> dict:
    """`reward_stats` of an image reward (prompt = the frame's instruction; ``meta`` default: `goal_meta`)
    on labelled `reach_clip` frames (``image``, ``instruction``, ``success``, ``goal_distance``)."""
    meta = goal_meta(data["instruction"]) if meta is None else meta
    with torch.no_grad():
        r = torch.cat(
            [
                reward(
                    data["image"][s : s + batch_size], data["instruction"][s : s + batch_size], meta[s : s + batch_size]
                )
                for s in range(0, data["image"].shape[0], batch_size)
            ]
        )
    return reward_stats(r, data["success"], data["goal_distance"])


def main() -> None:
    import argparse

    from mmrl.data import load_dataset

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/reach_clip")
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--time-limit", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 keeps torch's default)")
    parser.add_argument(
        "--relations", action="store_true", help="add reach_clip's caption of where the gripper is from each disc"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    data = load_dataset("reach_clip", num_samples=args.samples, seed=args.seed, relations=args.relations)
    _, info = train_tiny_clip(data, args.out, steps=args.steps, time_limit_s=args.time_limit, seed=args.seed)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
