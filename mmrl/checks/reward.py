"""Contract checker for reward models (see `mmrl.reward`).

``check_reward(reward_or_factory, kind="image")`` scores a few small generated batches and raises
``AssertionError`` naming the check and the problem on the first violation; it returns the names of
the checks that passed. It only calls ``reward(samples, prompts, meta)``, so it also checks rewards
that do not subclass `mmrl.reward.Reward`. An exception raised by the reward during a check that
expects a score is reported as that check's failure.

Checks, in order (``kind="image"``; ``kind="video"`` runs the same ones on uint8 videos
``[B, 4, 16, 16, 3]``, ``kind="text"`` on lists of strings):

- ``attributes``: ``name`` is a non-empty string and ``kind`` is the kind asked for.
- ``output``: float32 CPU tensor ``[B]``.
- ``finite``: no NaN / inf.
- ``batch_of_one``: a single sample scores.
- ``inputs_untouched``: the images (videos, completions) passed in are not modified.
- ``deterministic``: the same batch twice gives the same scores, and a sample repeated inside a
  batch gets the same score each time.
- ``batch_invariance``: each sample scores the same alone as within the batch (and the batch
  reversed gives the reversed scores), up to ``rtol = atol = 1e-4``.
- ``image_sizes`` (image only): 16 px, 48 px and non-square 24x40 images score.
- ``video_sizes`` (video only): a single 16 px frame, 3 frames of 24x40 and 6 frames of 32 px score.
- ``rejects_bad_input``: ``ValueError`` for float images / a wrong channel count / a missing batch
  dimension (image), the same for videos and an image batch without its frame dimension (video),
  a bare string or non-string items (text), a prompt list or meta list of the wrong length (all).

Inputs: ``prompts`` / ``meta`` when given, else the reward's own ``example_prompts`` /
``example_meta`` attributes when it has them (a reward that only understands its dataset's prompts
declares a few there), else defaults: image (and video) prompts with a short text in double quotes
(``a red sign that says "cat"``, so OCR-style rewards find a target) and no meta; text completions with
``meta = [{"answer": ...}]``. At most 3 text prompts (there are 3 default completions).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch

from mmrl.reward import check_kind

TOL = 1e-4
IMAGE_PROMPTS = ['a red sign that says "cat"', 'a poster with the word "hello"', 'a cube labelled "42"']
VIDEO_SHAPE = (4, 16, 16, 3)  # frames, height, width, channels of the default videos
TEXT_COMPLETIONS = ["42", "The answer is \\boxed{7}.", "It is a red cube."]
TEXT_PROMPTS = ["What is 6 times 7?", "How many cubes are there?", "What color is the cube?"]
TEXT_META = [
    {"answer": "42", "solution": "42"},
    {"answer": "7", "solution": "7"},
    {"answer": "red", "solution": "red"},
]  # TRL names it solution


class _Checker:
    def __init__(
        self, reward: Any, kind: str, prompts: Sequence[str] | None, meta: Sequence[dict] | None, verbose: bool
    ):
        self.reward, self.kind, self.verbose = reward, kind, verbose
        self.passed: list[str] = []
        self.check = "setup"
        self.samples: torch.Tensor | list[str]  # uint8 images [N, H, W, 3] or videos [N, F, H, W, 3], or completions
        self.meta: list[dict] | None
        gen = torch.Generator().manual_seed(0)
        if kind in ("image", "video"):
            self.prompts = list(prompts or IMAGE_PROMPTS)
            n = len(self.prompts)
            shape = (32, 32, 3) if kind == "image" else VIDEO_SHAPE
            noise = torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=gen)
            noise[0] = 200  # one flat image (a still video) among noise
            self.samples = noise
            self.meta = list(meta) if meta is not None else None
        else:
            self.prompts = list(prompts or TEXT_PROMPTS)
            self.samples = list(TEXT_COMPLETIONS[: len(self.prompts)])
            default_meta = TEXT_META[: len(self.prompts)] if prompts is None else None
            self.meta = list(meta) if meta is not None else default_meta
        if not 2 <= len(self.prompts) <= (3 if kind == "text" else 64):
            raise ValueError(f"check_reward needs 2 to {3 if kind == 'text' else 64} prompts, got {len(self.prompts)}")

    # ------------------------------------------------------------------ helpers
    def fail(self, msg: str) -> NoReturn:
        name = getattr(self.reward, "name", type(self.reward).__name__)
        raise AssertionError(f"check_reward[{self.check}] {name}: {msg}")

    def ensure(self, cond: Any, msg: str) -> None:
        if not cond:
            self.fail(msg)

    def ok(self) -> None:
        self.passed.append(self.check)
        if self.verbose:
            print(f"check_reward[{self.check}] ok")

    def take(self, idx: list[int]) -> tuple[Any, list[str], list[dict] | None]:
        """Rows ``idx`` of the samples (an image / video tensor or a list of completions), prompts and meta."""
        samples = self.samples[idx] if isinstance(self.samples, torch.Tensor) else [self.samples[i] for i in idx]
        meta = None if self.meta is None else [self.meta[i] for i in idx]
        return samples, [self.prompts[i] for i in idx], meta

    def score(self, samples, prompts, meta, what: str) -> torch.Tensor:
        try:
            out = self.reward(samples, prompts, meta)
        except Exception as exc:  # any failure here is a contract violation
            self.fail(f"{what} raised {type(exc).__name__}: {exc}")
        self.ensure(isinstance(out, torch.Tensor), f"{what}: must return a torch.Tensor, got {type(out).__name__}")
        self.ensure(out.dtype == torch.float32, f"{what}: must return float32, got {out.dtype}")
        self.ensure(out.device.type == "cpu", f"{what}: must return a CPU tensor, got {out.device}")
        self.ensure(tuple(out.shape) == (len(prompts),), f"{what}: shape {tuple(out.shape)} != [B] ({len(prompts)},)")
        return out

    def close(self, a: torch.Tensor, b: torch.Tensor, msg: str) -> None:
        self.ensure(torch.allclose(a, b, rtol=TOL, atol=TOL), f"{msg}: {a.tolist()} vs {b.tolist()}")

    def rejects(self, samples, prompts, meta, what: str) -> None:
        try:
            self.reward(samples, prompts, meta)
        except ValueError:
            return
        except Exception as exc:
            self.fail(f"{what} must raise ValueError, raised {type(exc).__name__}: {exc}")
        self.fail(f"{what} must raise ValueError, but it was scored")

    # ------------------------------------------------------------------ checks
    def run(self) -> list[str]:
        r, n = self.reward, len(self.prompts)
        self.check = "attributes"
        name = getattr(r, "name", None)
        self.ensure(isinstance(name, str) and name, f"name must be a non-empty string, got {name!r}")
        kind = getattr(r, "kind", None)
        self.ensure(kind == self.kind, f"kind is {kind!r}, expected {self.kind!r}")
        self.ensure(callable(r), "a reward must be callable as reward(samples, prompts, meta)")
        self.ok()

        every = list(range(n))
        self.check = "output"
        samples, prompts, meta = self.take(every)
        before = samples.clone() if isinstance(samples, torch.Tensor) else list(samples)
        full = self.score(samples, prompts, meta, f"a batch of {n}")
        self.ok()

        self.check = "finite"
        self.ensure(torch.isfinite(full).all(), f"scores have NaN/inf: {full.tolist()}")
        self.ok()

        self.check = "batch_of_one"
        self.score(*self.take([0]), "a batch of 1")
        self.ok()

        self.check = "inputs_untouched"
        same = torch.equal(samples, before) if isinstance(before, torch.Tensor) else samples == before
        self.ensure(same, "the reward modified the samples passed to it")
        self.ok()

        self.check = "deterministic"
        self.close(self.score(*self.take(every), "the same batch again"), full, "the same batch scored twice differs")
        dup = self.score(*self.take([1, 1, 0]), "a batch with a repeated sample")
        self.close(dup[0:1], dup[1:2], "a sample repeated in one batch got different scores")
        self.ok()

        self.check = "batch_invariance"
        alone = torch.cat([self.score(*self.take([i]), f"sample {i} alone") for i in every])
        self.close(alone, full, "samples scored alone differ from the same samples scored in one batch")
        rev = self.score(*self.take(every[::-1]), "the batch reversed")
        self.close(rev.flip(0), full, "reversing the batch changed the scores")
        self.ok()

        if self.kind == "image":
            self.check = "image_sizes"
            gen = torch.Generator().manual_seed(1)
            for h, w in ((16, 16), (48, 48), (24, 40)):
                imgs = torch.randint(0, 256, (n, h, w, 3), dtype=torch.uint8, generator=gen)
                out = self.score(imgs, self.prompts, self.meta, f"{h}x{w} images")
                self.ensure(torch.isfinite(out).all(), f"{h}x{w} images: scores have NaN/inf: {out.tolist()}")
            self.ok()

        if self.kind == "video":
            self.check = "video_sizes"
            gen = torch.Generator().manual_seed(1)
            for f, h, w in ((1, 16, 16), (3, 24, 40), (6, 32, 32)):
                videos = torch.randint(0, 256, (n, f, h, w, 3), dtype=torch.uint8, generator=gen)
                out = self.score(videos, self.prompts, self.meta, f"{f}-frame {h}x{w} videos")
                self.ensure(torch.isfinite(out).all(), f"{f}-frame {h}x{w} videos: scores have NaN/inf: {out.tolist()}")
            self.ok()

        self.check = "rejects_bad_input"
        samples, prompts, meta = self.take(every)
        if self.kind == "video":
            self.rejects(samples.float(), prompts, meta, "float videos")
            self.rejects(samples[..., :1].expand(-1, -1, -1, -1, 4).contiguous(), prompts, meta, "4-channel videos")
            self.rejects(samples[:, 0], prompts, meta, "images [B, H, W, 3] (no frame dimension)")
            self.rejects(samples[:, :0], prompts, meta, "videos of 0 frames")
            self.rejects(samples[0], prompts[:1], None if meta is None else meta[:1], "a video without a batch dim")
        elif self.kind == "image":
            self.rejects(samples.float(), prompts, meta, "float images")
            self.rejects(samples[..., :1].expand(-1, -1, -1, 4).contiguous(), prompts, meta, "4-channel images")
            self.rejects(samples[..., :1].contiguous(), prompts, meta, "1-channel images")
            self.rejects(samples[0], prompts[:1], None if meta is None else meta[:1], "an image without a batch dim")
        else:
            self.rejects(samples[0], prompts[:1], None if meta is None else meta[:1], "a bare string")
            self.rejects([1, 2, 3][:n], prompts, meta, "non-string completions")
        self.rejects(samples, prompts[:-1], None if meta is None else meta[:-1], f"{n} samples with {n - 1} prompts")
        self.rejects(samples, prompts, [{}] * (n + 1), f"{n} samples with {n + 1} meta entries")
        self.ok()
        return self.passed


def check_reward(
    factory_or_reward: Any | Callable[[], Any],
    kind: str = "image",
    verbose: bool = False,
    *,
    prompts: Sequence[str] | None = None,
    meta: Sequence[dict] | None = None,
) -> list[str]:
    """Run the contract checks; return the passed check names or raise ``AssertionError``.

    ``factory_or_reward``: a reward, or a zero-argument callable (a class included) that builds one.
    ``kind``: ``"image"``, ``"video"`` or ``"text"``. ``prompts`` / ``meta``: the inputs (see the module doc).
    """
    check_kind(kind)
    is_reward = not isinstance(factory_or_reward, type) and hasattr(factory_or_reward, "kind")
    reward = factory_or_reward if is_reward else factory_or_reward()
    if prompts is None:
        prompts = getattr(reward, "example_prompts", None)
        meta = getattr(reward, "example_meta", None) if meta is None else meta
    return _Checker(reward, kind, prompts, meta, verbose).run()


__all__ = ["check_reward"]


# ---- the audit on a labelled sample (`mmrl check reward NAME labelled=FILE`) --------------------------
SAMPLE_KEYS = {"image": "image", "video": "video", "text": "completion"}  # the samples' key by reward kind


def load_labelled(path: str | Path, kind: str) -> dict:
    """A labelled sample for `labelled_audit`: a ``torch.save`` dict holding the samples under
    `SAMPLE_KEYS` (uint8 ``image [N, H, W, 3]``, ``video [N, F, H, W, 3]`` or a list of ``completion``
    strings), the ``success`` label (bool ``[N]``) and the prompts (``instruction`` or ``prompt``,
    N strings); optional ``meta`` (N dicts) and ``task`` (a ground-truth reward, ``[N]``). The
    ``reach_clip`` dataset's labelled frames are one (``datasets/reach_clip/builder.py --labelled``).
    Raises ValueError naming what is missing."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"labelled={path}: no such file (a torch.save dict of samples, prompts and success)")
    try:
        data = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ValueError(f"labelled={path} cannot be read with torch.load: {type(exc).__name__}: {exc}") from None
    key = SAMPLE_KEYS[kind]
    if not isinstance(data, dict) or key not in data or "success" not in data:
        have = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ValueError(
            f"labelled={path} must hold '{key}' (the samples a {kind} reward scores) and 'success'; has {have}"
        )
    prompts = data.get("instruction", data.get("prompt"))
    n = len(data[key])
    if prompts is None or len(prompts) != n or len(data["success"]) != n:
        raise ValueError(
            f"labelled={path}: 'instruction' (or 'prompt') and 'success' must have one entry per sample ({n})"
        )
    return {
        "samples": data[key],
        "prompts": list(prompts),
        "success": torch.as_tensor(data["success"]).bool(),
        "meta": list(data["meta"]) if "meta" in data else [{} for _ in range(n)],
        "task": torch.as_tensor(data["task"]).float() if "task" in data else None,
    }


def labelled_audit(reward: Any, data: dict, heldout: Any = None, batch_size: int = 256) -> dict:
    """`mmrl.algorithms.reward_audit.audit_scores` of ``reward`` (and ``heldout``, a reward never
    trained on) on a labelled sample (`load_labelled`), scored in batches of ``batch_size``."""
    from mmrl.algorithms.reward_audit import audit_scores

    def scores(model) -> torch.Tensor:
        out = []
        with torch.no_grad():
            for i in range(0, len(data["prompts"]), batch_size):
                j = i + batch_size
                out.append(
                    torch.as_tensor(model(data["samples"][i:j], data["prompts"][i:j], data["meta"][i:j])).float()
                )
        return torch.cat(out)

    return audit_scores(scores(reward), data["success"], data["task"], scores(heldout) if heldout is not None else None)
