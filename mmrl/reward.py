"""The reward-model contract (checked by `mmrl.checks.reward.check_reward`).

A reward model scores a batch of single-turn samples and returns float32 ``[B]`` on the CPU:

- ``kind = "image"``: ``reward(images, prompts, meta)`` with ``images`` uint8 ``[B, H, W, 3]``,
  ``prompts`` a list of B strings and ``meta`` an optional list of B dicts (ground truth carried
  by the prompt dataset, e.g. ``{"color": "red", "count": 2}``).
- ``kind = "text"``: ``reward(completions, prompts, meta)`` with ``completions`` a list of B strings
  (VLM answers; ``meta`` holds e.g. ``{"answer": "42"}``).

Scores must not depend on which other samples share the batch (a sample scores the same alone or
in any batch, up to float tolerance), must be finite, and equal inputs give equal scores. Bad
input (wrong dtype, shape, or a prompt list of the wrong length) raises ``ValueError`` naming what
was expected. A reward model that fails while scoring raises; the trainer's reward stage
(`mmrl.trainer.reward_stage.RewardStage`, the only place reward models are called in a run) wraps
that in `RewardError` with the reward's name, and the run stops before touching the last
checkpoint. The stage also scores robot simulators' rendered frames with image rewards.

``WeightedSum`` combines several rewards of one kind: ``sum_i w_i * r_i`` and reports each part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch


class RewardError(RuntimeError):
    """A reward model failed while scoring a batch (the message names the reward)."""


class Reward:
    """Base class: subclasses set ``name`` and ``kind`` and implement `score`."""

    name: str = "reward"
    kind: str = "image"  # "image" or "text"

    def __call__(self, samples, prompts: Sequence[str], meta: Sequence[dict] | None = None) -> torch.Tensor:
        prompts = list(prompts)
        if self.kind == "image":
            check_images(samples, len(prompts))
        else:
            if not isinstance(samples, (list, tuple)) or not all(isinstance(s, str) for s in samples):
                raise ValueError(f"reward '{self.name}' scores text: pass a list of strings")
            if len(samples) != len(prompts):
                raise ValueError(f"reward '{self.name}': {len(samples)} completions but {len(prompts)} prompts")
        if meta is not None and len(meta) != len(prompts):
            raise ValueError(f"reward '{self.name}': {len(meta)} meta entries but {len(prompts)} prompts")
        out = self.score(samples, prompts, list(meta) if meta is not None else [{} for _ in prompts])
        return torch.as_tensor(out, dtype=torch.float32).detach().cpu().reshape(len(prompts))

    def score(self, samples, prompts: list[str], meta: list[dict]) -> torch.Tensor:
        raise NotImplementedError

    def preflight(self) -> None:
        """Called once before a run starts any work: raise `RewardError` naming the problem when
        the reward cannot score (e.g. its server does not answer). Default: nothing to check."""

    def parts(self, samples, prompts, meta=None) -> dict[str, torch.Tensor]:
        """Named components for logging (a single reward: itself)."""
        return {self.name: self(samples, prompts, meta)}


def check_images(images, n: int | None = None) -> None:
    if (
        not isinstance(images, torch.Tensor)
        or images.dtype != torch.uint8
        or images.dim() != 4
        or images.shape[-1] != 3
    ):
        got = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        dtype = getattr(images, "dtype", "")
        raise ValueError(f"image rewards take uint8 images [B, H, W, 3], got {got} {dtype}")
    if n is not None and images.shape[0] != n:
        raise ValueError(f"{images.shape[0]} images but {n} prompts")


class WeightedSum(Reward):
    """``sum_i weight_i * reward_i`` over rewards of the same kind."""

    def __init__(
        self,
        rewards: dict[str, Reward] | Sequence[Reward],
        weights: Sequence[float] | None = None,
        name: str = "weighted_sum",
    ):
        items = list(rewards.items()) if isinstance(rewards, dict) else [(r.name, r) for r in rewards]
        if not items:
            raise ValueError("WeightedSum needs at least one reward")
        kinds = {r.kind for _, r in items}
        if len(kinds) != 1:
            raise ValueError(f"WeightedSum mixes reward kinds {sorted(kinds)}; combine one kind at a time")
        weights = [1.0] * len(items) if weights is None else [float(w) for w in weights]
        if len(weights) != len(items):
            raise ValueError(f"{len(weights)} weights for {len(items)} rewards")
        self.items, self.weights, self.name, self.kind = items, weights, name, kinds.pop()

    def parts(self, samples, prompts, meta=None) -> dict[str, torch.Tensor]:
        out = {}
        for key, reward in self.items:
            try:
                out[key] = reward(samples, prompts, meta)
            except Exception as exc:  # name the failing part
                raise RewardError(f"reward '{key}' failed: {exc}") from exc
        return out

    def score(self, samples, prompts, meta) -> torch.Tensor:
        return self.combine(self.parts(samples, prompts, meta))

    def preflight(self) -> None:
        for _, reward in self.items:  # e.g. a reward server among the parts
            reward.preflight()

    def combine(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """The weighted sum of `parts`; a NaN part (a function reward's None: "does not apply") is
        left out of its sample's sum, which is NaN only when every part is."""
        stacked = torch.stack([w * parts[k] for (k, _), w in zip(self.items, self.weights)])
        total = torch.nansum(stacked, 0)
        return torch.where(torch.isnan(stacked).all(0), torch.full_like(total, float("nan")), total)


MESSAGES = "messages"  # a text sample's meta key holding its prompt as chat messages (TRL's conversational form)


class FunctionReward(Reward):
    """Any Python callable as a reward, as TRL takes them: ``fn(samples, prompts=[...], **columns)``
    returns one score per sample (a list of floats, a tensor or an array). ``samples`` are the
    completions (text) or the uint8 images ``[B, H, W, 3]``; ``columns`` are the keys of the samples'
    ``meta`` (the dataset's ground truth and extra columns, e.g. ``answer``, ``solution``), each a
    list over the batch (None where a sample lacks it). ``fn`` gets the keywords its signature names,
    or all of them if it takes ``**kwargs``. A None score (TRL's "does not apply") becomes NaN: in a
    weighted sum the other parts decide; alone, the episode is dropped and counted by the trainer.

    Completions take the form TRL gives them for the same data: strings for prompts that are strings
    (TRL's standard format); for prompts that are chat messages (TRL's conversational format: the
    dataset's samples carry them as ``meta["messages"]``) each completion is
    ``[{"role": "assistant", "content": text}]`` and ``prompts`` are the messages, so `trl.rewards`'
    functions (``completion[0]["content"]``) run unchanged."""

    def __init__(self, fn, kind: str, name: str | None = None, **bound):
        import inspect

        if not callable(fn):
            raise TypeError(f"a function reward needs a callable, got {type(fn).__name__}")
        if kind not in ("image", "text"):
            raise ValueError(f"kind must be 'image' or 'text', got {kind!r}")
        self.fn, self.kind, self.bound = fn, kind, bound
        fn_name: str = getattr(fn, "__name__", type(fn).__name__)
        self.name = name or fn_name
        params: Mapping[str, inspect.Parameter]
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):  # a builtin without a signature: give it everything
            params = {}
        positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if params and not positional and not any(p.kind is p.VAR_POSITIONAL for p in params.values()):
            raise TypeError(
                f"reward function {self.name} must take the samples as its first argument "
                "(TRL style: def reward(completions, **kwargs) -> list[float])"
            )
        self._first = positional[0].name if positional else None
        self._takes_all = not params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        self._names = set(params)

    def score(self, samples, prompts, meta) -> torch.Tensor:
        conversational = self.kind == "text" and bool(meta) and all(isinstance(m.get(MESSAGES), list) for m in meta)
        keys = sorted({k for m in meta for k in m} - ({MESSAGES} if conversational else set()))
        if conversational:  # as TRL passes them for chat prompts
            prompts = [m[MESSAGES] for m in meta]
            samples = [[{"role": "assistant", "content": c}] for c in samples]
        offered = {"prompts": prompts, **{k: [m.get(k) for m in meta] for k in keys}, **self.bound}
        offered.pop(self._first, None)  # the samples travel positionally
        kwargs = offered if self._takes_all else {k: v for k, v in offered.items() if k in self._names}
        try:
            out = self.fn(list(samples) if self.kind == "text" else samples, **kwargs)
        except (TypeError, IndexError, KeyError) as exc:
            if self.kind != "text" or conversational:
                raise
            raise type(exc)(
                f"{exc} (the completions are strings: the dataset's prompts are strings, TRL's standard format; "
                "a reward that reads completion[0]['content'] needs conversational prompts, chat messages "
                "[{'role': 'user', 'content': ...}] in the prompt column)"
            ) from exc
        if isinstance(out, torch.Tensor):
            return out.detach().float().cpu().reshape(-1)
        values = [float("nan") if v is None else v for v in (out.tolist() if hasattr(out, "tolist") else list(out))]
        if len(values) != len(prompts):
            raise ValueError(f"reward function {self.name} returned {len(values)} scores for {len(prompts)} samples")
        return torch.tensor(values, dtype=torch.float32)


def import_reference(ref: str):
    """The object a ``module.path:attr`` or ``path/to/file.py:attr`` reference names (TRL's
    ``--reward_funcs my_lib.fn`` style, verl's file path + function). Raises ValueError naming what
    could not be found and the two accepted forms."""
    import importlib
    import importlib.util
    from pathlib import Path

    where, sep, attr = ref.rpartition(":")
    if not sep or not where or not attr:
        raise ValueError(f"{ref!r} is not a reference: use 'module.path:function' or 'path/to/file.py:function'")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ValueError(f"reward file {path} not found (from {ref!r}); paths are relative to the current folder")
        spec = importlib.util.spec_from_file_location(f"mmrl_user_{path.stem}", path)
        assert spec is not None and spec.loader is not None  # a .py path always gets a source loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise ValueError(
                f"cannot import module {where!r} (from {ref!r}): {exc}; install it or give a file: "
                "'path/to/file.py:function'"
            ) from None
    if not hasattr(module, attr):
        found = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise ValueError(f"{where} has no {attr!r} (from {ref!r}); callables there: {', '.join(found) or 'none'}")
    return getattr(module, attr)


def as_reward(obj, kind: str, name: str | None = None, **bound) -> Reward:
    """A `Reward` from a Reward instance (returned as it is), a Reward class, or any callable
    (`FunctionReward`); ``bound`` keyword arguments go to a class's constructor or to the function."""
    if isinstance(obj, Reward):
        return obj
    if isinstance(obj, type) and issubclass(obj, Reward):
        return obj(**bound)
    return FunctionReward(obj, kind, name=name, **bound)
