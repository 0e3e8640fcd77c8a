"""A success detector trained on labelled frames: the image reward that judges imagined episodes.

Learning inside a world model needs a reward for frames no simulator rendered. This module trains
one from recorded episodes: `labelled_frames` turns decision records (`mmrl.episodes`) into frames
labelled with the task's own success flag (every decision's next observation, labelled with whether
its chunk reached success, plus every episode's start frame, a failure), `train_success_detector`
fits `SuccessNet` to them with a binary cross-entropy, and `SuccessDetector` serves the trained net
as an ``image`` reward (``success_detector``): the probability of success of a frame given its
instruction, or a 1/0 label at a threshold.

`SuccessNet` is a small CNN: the frame in ``[-1, 1]`` with two CoordConv channels (x and y in
``[-1, 1]``) so that positions are easy to read, three convolutions (to 1/4 of the frame's size)
whose first is modulated by the instruction (FiLM from mean-pooled `hash_tokenize` word embeddings:
the colour word names the goal disc, so the first features can single out its pixels), GroupNorm
(per sample: no batch statistics, so a frame scores the same alone or in any batch), then global max
and mean pooling and a two-layer head to one logit. Success is a local event (the gripper's cross on
the named disc), which the max-pooled features detect anywhere in the frame.

Training draws class-balanced batches (half positive) with a seeded generator, so the probability
is the one for equally likely success and failure (a threshold of 0.5 balances both errors; at the
frames' own ~10% success rate precision is lower than recall). Each batch is turned by one of the 8
rotations / mirrorings of the square (``augment=True``): the reach task's success does not change
under them, and with ~100 successful episodes it is what keeps the net from memorising its
positives (300 steps on 200 episodes, balanced accuracy on 1000 new episodes: 0.68 / 0.72 without,
0.92 / 0.93 with, seeds 0 / 1). Turn it off for tasks whose instructions name directions ("the
left bowl"). The held-out accuracy, balanced accuracy, precision and recall are measured on a
seeded split of the rows.

    python -m rewards.success_detector --episodes 1000 --out runs/success_detector   # 80-100 s, one core

(1500 steps on 1000 episodes: held-out balanced accuracy 0.94, precision 0.68, recall 0.93; on
1000 new episodes 0.955, 0.75, 0.95.)

Honest limits: success is a sub-2-pixel judgement at 32 px (the gripper within 0.1 world units
= 1.6 px of the disc's centre), and the errors sit at that edge: of the failures of new episodes
(the CLI's net), those ending 0.1-0.15 from the disc are called successes 69% of the time, 0.15-0.2
21%, farther ones under 1%; frames with the gripper on another colour's disc 7 times in 24. It
knows only what its frames show. Trained on reach_demos it has seen the expert's straight paths
and their end frames; frames far from that distribution (a world model's
blurry or broken renders, a policy that hovers at the disc's edge, other simulator settings) get
scores nobody measured, and a policy optimised against it may find frames it wrongly calls
successes (reward hacking): audit it on real rollouts (`mmrl check reward success_detector
labelled=...`) and retrain on them, as the Dyna loop does each round (``net=`` fine-tunes). The
held-out split is by frame, so frames of one episode can sit on both sides: the held-out numbers
measure frames like the training ones, not new tasks. Images of another size are resized to the
size it was trained at (non-square ones are stretched). The word embedding table holds most of the
parameters (``buckets x dim``), but only the rows of the instructions' few words are ever trained.
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
from torch import nn

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmrl.episodes import episode_starts, transitions
from mmrl.policies.tiny_backbone import hash_tokenize
from mmrl.reward import LearnedReward
from mmrl.utils.weights import load_weights, save_weights

WEIGHTS = "model.safetensors"
CONFIG = "success_detector.json"
OUTPUTS = ("probability", "label")


class SuccessNet(nn.Module):
    """Frame + instruction -> one success logit (see the module doc). Images uint8 ``[B, H, W, 3]``
    of any size (the convolutions are followed by global pooling); ``image_size`` is the size it is
    trained at, which `SuccessDetector` resizes other frames to."""

    def __init__(self, image_size: int = 32, ch: int = 32, dim: int = 64, buckets: int = 4096, max_words: int = 16):
        super().__init__()
        if int(image_size) < 8 or min(ch, dim, max_words) < 1 or buckets < 2:
            raise ValueError(
                f"SuccessNet needs image_size >= 8, ch, dim, max_words >= 1 and buckets >= 2; got "
                f"image_size={image_size}, ch={ch}, dim={dim}, buckets={buckets}, max_words={max_words}"
            )
        self.args = {"image_size": int(image_size), "ch": ch, "dim": dim, "buckets": buckets, "max_words": max_words}
        self.image_size, self.buckets, self.max_words = int(image_size), buckets, max_words
        groups = math.gcd(ch, 8)
        self.words = nn.Embedding(buckets, dim, padding_idx=0)
        self.film = nn.Linear(dim, 2 * ch)  # instruction -> per-channel scale and shift of conv1
        self.conv1 = nn.Conv2d(5, ch, 4, stride=2, padding=1)  # RGB + x/y coordinates -> H/2
        self.conv2 = nn.Conv2d(ch, ch, 3, stride=2, padding=1)  # H/4
        self.conv3 = nn.Conv2d(ch, ch, 3, padding=1)  # H/4
        self.norm1, self.norm2, self.norm3 = (nn.GroupNorm(groups, ch) for _ in range(3))
        self.head = nn.Sequential(nn.Linear(2 * ch, dim), nn.ReLU(), nn.Linear(dim, 1))

    def text_features(self, prompts: Sequence[str], device: torch.device) -> torch.Tensor:
        """Mean-pooled word embeddings ``[B, dim]`` of the instructions (each distinct one embedded once)."""
        distinct = list(dict.fromkeys(prompts))
        where = {p: i for i, p in enumerate(distinct)}
        ids = hash_tokenize(distinct, self.buckets, self.max_words).to(device)
        mask = (ids > 0).unsqueeze(-1).float()
        pooled = (self.words(ids) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return pooled[torch.tensor([where[p] for p in prompts], dtype=torch.long, device=device)]

    def forward(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        """Logits ``[B]`` of uint8 frames ``[B, H, W, 3]`` and their B instructions."""
        if images.dim() != 4 or images.shape[-1] != 3 or len(prompts) != images.shape[0]:
            raise ValueError(f"SuccessNet takes images [B, H, W, 3] and B prompts, got {tuple(images.shape)}")
        b, h, w, _ = images.shape
        dev = self.conv1.weight.device
        x = images.to(dev).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
        ys = torch.linspace(-1.0, 1.0, h, device=dev).view(1, 1, h, 1).expand(b, 1, h, w)
        xs = torch.linspace(-1.0, 1.0, w, device=dev).view(1, 1, 1, w).expand(b, 1, h, w)
        x = torch.cat([x, xs, ys], dim=1)  # CoordConv
        scale, shift = self.film(self.text_features(prompts, dev)).chunk(2, dim=-1)
        z = torch.addcmul(shift[..., None, None], self.norm1(self.conv1(x)), 1 + scale[..., None, None])  # FiLM
        z = F.relu(z, inplace=True)
        z = F.relu(self.norm2(self.conv2(z)), inplace=True)
        z = F.relu(self.norm3(self.conv3(z)), inplace=True)
        pooled = torch.cat([z.amax(dim=(2, 3)), z.mean(dim=(2, 3))], dim=1)
        return self.head(pooled).squeeze(-1)


# ----------------------------------------------------------------------------- data
def labelled_frames(records: dict) -> tuple[torch.Tensor, list[str], torch.Tensor]:
    """``(images uint8 [M', H, W, 3], prompts, labels bool [M'])`` of decision records: every
    decision's next observation labelled with its success (`mmrl.episodes.transitions`), then every
    episode's start frame labelled False (no episode starts at its goal)."""
    tr = transitions(records)
    starts = episode_starts(records)
    images = torch.cat([tr["next_image"], records["image"][starts]])
    prompts = [*tr["instruction"], *(records["instruction"][i] for i in starts.tolist())]
    labels = torch.cat([tr["success"].bool(), torch.zeros(starts.numel(), dtype=torch.bool)])
    return images, prompts, labels


def classification_metrics(logits: torch.Tensor, labels: torch.Tensor, prefix: str = "") -> dict[str, float]:
    """Accuracy, balanced accuracy (mean of the recalls of both classes), precision and recall of
    ``logits > 0`` against bool ``labels`` (a ratio with nothing to count is 0)."""
    pred, y = logits > 0, labels.bool()
    tp, tn = (pred & y).sum().item(), (~pred & ~y).sum().item()
    fp, fn = (pred & ~y).sum().item(), (~pred & y).sum().item()

    def ratio(a: float, b: float) -> float:
        return round(a / b, 4) if b else 0.0

    recall, specificity = ratio(tp, tp + fn), ratio(tn, tn + fp)
    return {
        f"{prefix}accuracy": ratio(tp + tn, len(y)),
        f"{prefix}balanced_accuracy": round((recall + specificity) / 2, 4),
        f"{prefix}precision": ratio(tp, tp + fp),
        f"{prefix}recall": recall,
    }


@torch.no_grad()
def predict_logits(
    net: SuccessNet, images: torch.Tensor, prompts: Sequence[str], batch_size: int = 512
) -> torch.Tensor:
    """Logits ``[B]`` (CPU) of ``net`` in eval mode, in batches of ``batch_size``."""
    was_training = net.training
    net.eval()
    out = [
        net(images[i : i + batch_size], prompts[i : i + batch_size]).cpu() for i in range(0, len(prompts), batch_size)
    ]
    net.train(was_training)
    return torch.cat(out) if out else torch.zeros(0)


# ----------------------------------------------------------------------------- training
def train_success_detector(
    images: torch.Tensor,
    prompts: Sequence[str],
    labels: torch.Tensor,
    *,
    steps: int = 1500,
    batch_size: int = 128,
    lr: float = 2e-3,
    seed: int = 0,
    net: SuccessNet | None = None,
    image_size: int | None = None,
    held_out: float = 0.1,
    progress: bool = True,
    augment: bool = True,
) -> tuple[SuccessNet, dict[str, Any]]:
    """Fit a `SuccessNet` (a new one of ``image_size``, default the frames' height; or ``net``,
    fine-tuned) to labelled frames with Adam (cosine-decayed ``lr``) on class-balanced batches,
    each rotated / mirrored at random with ``augment`` (square frames are rotated, others only mirrored).

    A seeded ``held_out`` share of the rows is kept out of training and scored at the end. Returns
    ``(net in eval mode, metrics)``: ``held_out_accuracy``, ``held_out_balanced_accuracy``,
    ``held_out_precision``, ``held_out_recall`` (None without a held-out split), ``positives``,
    ``frames``, ``train_loss`` (mean of the last 50 steps), ``held_out_frames``, ``steps``, ``wall_s``.
    """
    labels = torch.as_tensor(labels).bool().cpu()
    prompts = list(prompts)
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[-1] != 3:
        raise ValueError(f"train_success_detector takes uint8 images [M, H, W, 3], got {tuple(images.shape)}")
    if not len(prompts) == len(labels) == images.shape[0]:
        raise ValueError(f"{images.shape[0]} images, {len(prompts)} prompts and {len(labels)} labels: one each")
    if not 0 <= held_out < 1 or steps < 1 or batch_size < 2:
        raise ValueError(f"need 0 <= held_out < 1, steps >= 1, batch_size >= 2; got {held_out}, {steps}, {batch_size}")
    m = len(labels)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(m, generator=gen)
    n_test = int(round(m * held_out))
    test, train = order[:n_test], order[n_test:]
    pos, neg = train[labels[train]], train[~labels[train]]
    if pos.numel() == 0 or neg.numel() == 0:
        raise ValueError(
            f"the training frames need both successes and failures: {pos.numel()} positive, {neg.numel()} negative "
            "(record more episodes, or episodes that reach the goal)"
        )
    if net is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = SuccessNet(image_size=image_size or images.shape[1])
    device = next(net.parameters()).device
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / steps)))
    half = batch_size // 2
    y = torch.cat([torch.ones(half), torch.zeros(batch_size - half)]).to(device)
    from tqdm import tqdm

    net.train()
    losses: list[float] = []
    t0 = time.time()
    bar = tqdm(range(steps), desc="success detector", unit="step", disable=not progress, dynamic_ncols=True)
    for step in bar:
        rows = torch.cat(
            [
                pos[torch.randint(0, pos.numel(), (half,), generator=gen)],
                neg[torch.randint(0, neg.numel(), (batch_size - half,), generator=gen)],
            ]
        )
        batch = images[rows]
        if augment:
            turn, mirror = torch.randint(0, 4, (2,), generator=gen).tolist()
            if batch.shape[1] == batch.shape[2]:
                batch = torch.rot90(batch, turn, dims=(1, 2))
            if mirror % 2:
                batch = batch.flip(2)
        loss = F.binary_cross_entropy_with_logits(net(batch, [prompts[i] for i in rows.tolist()]), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 50 == 49:
            bar.set_postfix(loss=f"{sum(losses[-50:]) / 50:.4f}")
    net.eval()
    tail = losses[-50:]
    metrics: dict[str, Any] = {
        "held_out_accuracy": None,
        "held_out_balanced_accuracy": None,
        "held_out_precision": None,
        "held_out_recall": None,
    }
    if n_test:
        logits = predict_logits(net, images[test], [prompts[i] for i in test.tolist()])
        metrics.update(classification_metrics(logits, labels[test], prefix="held_out_"))
    metrics.update(
        positives=int(labels.sum()),
        frames=m,
        train_loss=round(sum(tail) / len(tail), 4),
        held_out_frames=n_test,
        steps=steps,
        wall_s=round(time.time() - t0, 1),
        seed=seed,
        augment=augment,
    )
    return net, metrics


# ----------------------------------------------------------------------------- files
def save_detector(net: SuccessNet, folder: str | Path) -> Path:
    """Write ``model.safetensors`` and ``success_detector.json`` (the architecture) to ``folder``."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    save_weights(net.state_dict(), out / WEIGHTS, metadata={"mmrl.success_detector": json.dumps(net.args)})
    (out / CONFIG).write_text(json.dumps(net.args, indent=2) + "\n")
    return out


def load_detector(folder: str | Path, device: str | torch.device = "cpu") -> SuccessNet:
    """The `SuccessNet` `save_detector` wrote to ``folder`` (eval mode, on ``device``)."""
    folder = Path(folder)
    missing = [name for name in (WEIGHTS, CONFIG) if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{folder} is not a success detector (no {' or '.join(missing)}): train one with "
            f"`python -m rewards.success_detector --out {folder}`"
        )
    try:
        args = json.loads((folder / CONFIG).read_text())
        net = SuccessNet(**args)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{folder / CONFIG} does not describe a SuccessNet: {exc}") from None
    state, _ = load_weights(folder / WEIGHTS)
    net.load_state_dict(state)
    return net.to(device).eval()


# ----------------------------------------------------------------------------- the reward
class SuccessDetector(LearnedReward):
    """Image reward: a trained `SuccessNet`'s probability that each frame shows its instruction
    done (``output="probability"``, in [0, 1]) or 1/0 at ``threshold`` (``output="label"``).
    Exactly one of ``path`` (a folder `save_detector` wrote) and ``model`` (a built net)."""

    name = "success_detector"
    kind = "image"
    example_prompts = ["reach the red target", "go to the blue disc", "touch the green target"]

    def __init__(
        self,
        *,
        path: str | Path | None = None,
        model: SuccessNet | None = None,
        output: str = "probability",
        threshold: float = 0.5,
        device: str | torch.device = "cpu",
        batch_size: int = 512,
    ):
        if (path is None) == (model is None):
            raise ValueError(
                "success_detector needs exactly one of path= (a folder written by "
                "`python -m rewards.success_detector --out FOLDER`) and model= (a SuccessNet)"
            )
        if output not in OUTPUTS:
            raise ValueError(f"success_detector output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        if not 0 < threshold < 1 or batch_size < 1:
            raise ValueError(
                f"success_detector needs 0 < threshold < 1 and batch_size >= 1, got {threshold}, {batch_size}"
            )
        self.device = torch.device(device)
        if model is not None:
            self.net = model.to(self.device).eval()
        else:
            assert path is not None  # exactly one of the two, checked above
            self.net = load_detector(path, self.device)
        self.output, self.threshold, self.batch_size = output, float(threshold), int(batch_size)

    # the hooks a Dyna loop trains a reward model through (untrained -> fit every round -> save)
    @classmethod
    def untrained(cls, image_size: int, seed: int = 0) -> SuccessDetector:
        """A detector with a freshly initialised `SuccessNet` for frames of side ``image_size``."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls(model=SuccessNet(image_size=image_size))

    def fit(self, records: dict, steps: int, seed: int = 0) -> dict[str, Any]:
        """Train the net ``steps`` more steps on the labelled frames of decision records; its metrics."""
        self.net, metrics = train_success_detector(*labelled_frames(records), steps=steps, seed=seed, net=self.net)
        return metrics

    def save(self, folder: str | Path) -> None:
        """Write the net to ``folder`` (`save_detector`), which ``path=`` loads."""
        save_detector(self.net, folder)

    @torch.no_grad()
    def probability(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        """Success probabilities float32 ``[B]`` (CPU) of uint8 frames ``[B, H, W, 3]``; frames of
        another size are resized to the net's ``image_size``."""
        self.net.eval()
        size = self.net.image_size
        out = []
        for i in range(0, images.shape[0], self.batch_size):
            x = images[i : i + self.batch_size].to(self.device)
            if tuple(x.shape[1:3]) != (size, size):
                x = F.interpolate(x.permute(0, 3, 1, 2).float(), size=(size, size), mode="bilinear", antialias=True)
                x = x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
            out.append(torch.sigmoid(self.net(x, list(prompts[i : i + self.batch_size]))).float().cpu())
        return torch.cat(out) if out else torch.zeros(0)

    def score(self, samples: torch.Tensor, prompts: list[str], meta: list[dict]) -> torch.Tensor:
        p = self.probability(samples, prompts)
        return (p >= self.threshold).float() if self.output == "label" else p


# ----------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> None:
    import argparse

    from mmrl.data import load_dataset

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--out", default="runs/success_detector")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--expert-speed", type=float, default=0.4)
    parser.add_argument("--no-augment", action="store_true", help="no random rotations / mirrorings of batches")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 keeps torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    records = load_dataset(
        "reach_demos",
        num_episodes=args.episodes,
        seed=args.seed,
        chunk_size=4,
        sim_kwargs={"image_size": 32, "num_objects": 3, "max_episode_steps": 20},
        expert_speed=args.expert_speed,
    )
    images, prompts, labels = labelled_frames(records)
    net, metrics = train_success_detector(
        images,
        prompts,
        labels,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        augment=not args.no_augment,
    )
    save_detector(net, args.out)
    print(json.dumps({**metrics, "episodes": args.episodes, "out": str(args.out)}))


if __name__ == "__main__":
    main()
