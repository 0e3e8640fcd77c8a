"""The reward-model contract (checked by `mmrl.checks.reward.check_reward`).

A reward model scores a batch of single-turn samples and returns float32 ``[B]`` on the CPU:

- ``kind = "image"``: ``reward(images, prompts, meta)`` with ``images`` uint8 ``[B, H, W, 3]``,
  ``prompts`` a list of B strings and ``meta`` an optional list of B dicts (ground truth carried
  by the prompt dataset, e.g. ``{"color": "red", "count": 2}``).
- ``kind = "video"``: ``reward(videos, prompts, meta)`` with ``videos`` uint8 ``[B, F, H, W, 3]``
  (F >= 1 frames, in time order), ``prompts`` and ``meta`` as for images (generated videos).
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

import functools
import math
import reprlib
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from mmrl.errors import UserError
from mmrl.utils.deadline import CallLimit, CallTimedOut


class RewardError(RuntimeError):
    """A reward model failed while scoring a batch (the message names the reward)."""


class RewardFunctionError(UserError, RewardError):
    """A user's reward function (`FunctionReward`) raised, returned something other than one score
    per sample, or ran past its time limit: one line naming the function (file:name), what it did
    and what was expected. Not a bug of mmrl: the trainer stops the run with it, the newest complete
    checkpoint kept."""


#: what a reward model scores: generated images, generated videos, or text completions
KINDS = ("image", "video", "text")


class Reward:
    """Base class: subclasses set ``name`` and ``kind`` and implement `score`."""

    name: str = "reward"
    kind: str = "image"  # one of `KINDS`: "image", "video" or "text"

    def __call__(self, samples, prompts: Sequence[str], meta: Sequence[dict] | None = None) -> torch.Tensor:
        prompts = list(prompts)
        self.check_inputs(samples, prompts, meta)
        out = self.score(samples, prompts, list(meta) if meta is not None else [{} for _ in prompts])
        return torch.as_tensor(out, dtype=torch.float32).detach().cpu().reshape(len(prompts))

    def check_inputs(self, samples, prompts: list[str], meta: Sequence[dict] | None) -> None:
        """ValueError naming what was expected unless ``samples`` are of this reward's kind, one per
        prompt, with one meta entry per prompt (or none)."""
        if self.kind == "image":
            check_images(samples, len(prompts))
        elif self.kind == "video":
            check_videos(samples, len(prompts))
        else:
            if not isinstance(samples, (list, tuple)) or not all(isinstance(s, str) for s in samples):
                raise ValueError(f"reward '{self.name}' scores text: pass a list of strings")
            if len(samples) != len(prompts):
                raise ValueError(f"reward '{self.name}': {len(samples)} completions but {len(prompts)} prompts")
        if meta is not None and len(meta) != len(prompts):
            raise ValueError(f"reward '{self.name}': {len(meta)} meta entries but {len(prompts)} prompts")

    def score(self, samples, prompts: list[str], meta: list[dict]) -> torch.Tensor:
        raise NotImplementedError

    def preflight(self) -> None:
        """Called once before a run starts any work: raise `RewardError` naming the problem when
        the reward cannot score (e.g. its server does not answer). Default: nothing to check."""

    def parts(self, samples, prompts, meta=None) -> dict[str, torch.Tensor]:
        """Named components for logging (a single reward: itself)."""
        return {self.name: self(samples, prompts, meta)}


class ComponentReward(Reward):
    """A reward computed from named components (`components`: floats [B], ``score`` among them),
    which `parts` logs as ``<name>/<component>`` for each of ``logged`` beside the score itself
    (e.g. the programmatic ``shapes`` and ``moving_shapes`` rewards)."""

    logged: tuple[str, ...] = ()

    def components(self, samples, prompts: list[str], meta: Sequence[dict] | None = None) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def score(self, samples, prompts, meta) -> torch.Tensor:
        return self.components(samples, prompts, meta)["score"]

    def parts(self, samples, prompts, meta=None) -> dict[str, torch.Tensor]:
        prompts = list(prompts)
        self.check_inputs(samples, prompts, meta)
        comps = self.components(samples, prompts, meta)
        return {self.name: comps["score"], **{f"{self.name}/{k}": comps[k] for k in self.logged}}


class LearnedReward(Reward):
    """A reward model trained on labelled frames of recorded episodes (decision records,
    `mmrl.episodes`): what a Dyna loop (`mmrl.dyna`) trains on the demonstrations and refreshes on
    every round's real episodes. Subclasses implement the three hooks."""

    @classmethod
    def untrained(cls, image_size: int, seed: int = 0) -> LearnedReward:
        """A freshly initialised model for frames of side ``image_size`` (weights from ``seed``)."""
        raise NotImplementedError

    def fit(self, records: dict, steps: int, seed: int = 0) -> dict:
        """Train ``steps`` more steps on the labelled frames of ``records``; returns its metrics
        (held-out accuracy and the like)."""
        raise NotImplementedError

    def save(self, folder) -> None:
        """Write the model to ``folder``, which the reward's ``path=`` argument loads."""
        raise NotImplementedError


def check_kind(kind) -> None:
    """ValueError unless ``kind`` is one of `KINDS`."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")


def _check_pixels(x, n: int | None, noun: str, layout: str, shape_ok) -> None:
    """ValueError unless ``x`` is a uint8 tensor whose shape passes ``shape_ok`` (and has ``n`` rows):
    the one check of `check_images` and `check_videos` (``noun``: "images" / "videos")."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or not shape_ok(x.shape):
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        dtype = getattr(x, "dtype", "")
        raise ValueError(f"{noun[:-1]} rewards take uint8 {noun} {layout}, got {got} {dtype}")
    if n is not None and x.shape[0] != n:
        raise ValueError(f"{x.shape[0]} {noun} but {n} prompts")


def check_images(images, n: int | None = None) -> None:
    """ValueError unless ``images`` is uint8 ``[B, H, W, 3]`` (and B == ``n``)."""
    _check_pixels(images, n, "images", "[B, H, W, 3]", lambda s: len(s) == 4 and s[-1] == 3)


def check_videos(videos, n: int | None = None) -> None:
    """ValueError unless ``videos`` is uint8 ``[B, F, H, W, 3]`` with F >= 1 (and B == ``n``)."""
    _check_pixels(videos, n, "videos", "[B, F, H, W, 3]", lambda s: len(s) == 5 and s[-1] == 3 and s[1] >= 1)


class WeightedSum(Reward):
    """``sum_i weight_i * reward_i`` over rewards of the same kind. With ``normalize``, each part is
    first standardised over the batch it scored (`standardize`: mean 0, std 1 over its finite
    scores), so that no reward's scale swamps the others whatever its units (GDPO's decoupled
    normalisation, over the batch); `combine` with ``normalize=False`` gives the raw sum."""

    def __init__(
        self,
        rewards: dict[str, Reward] | Sequence[Reward],
        weights: Sequence[float] | None = None,
        name: str = "weighted_sum",
        normalize: bool = False,
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
        self.normalize = bool(normalize)

    def parts(self, samples, prompts, meta=None) -> dict[str, torch.Tensor]:
        out = {}
        for key, reward in self.items:
            try:
                out[key] = reward(samples, prompts, meta)
            except UserError:  # a user's function: its own one line names it
                raise
            except Exception as exc:  # name the failing part
                raise RewardError(f"reward '{key}' failed: {exc}") from exc
        return out

    def score(self, samples, prompts, meta) -> torch.Tensor:
        return self.combine(self.parts(samples, prompts, meta))

    def preflight(self) -> None:
        for _, reward in self.items:  # e.g. a reward server among the parts
            reward.preflight()

    def combine(self, parts: dict[str, torch.Tensor], normalize: bool | None = None) -> torch.Tensor:
        """The weighted sum of `parts` (each standardised first when ``normalize``, by default the
        sum's own setting); a NaN part (a function reward's None: "does not apply") is left out of
        its sample's sum, which is NaN only when every part is."""
        norm = self.normalize if normalize is None else normalize
        scale = standardize if norm else (lambda x: x)
        stacked = torch.stack([w * scale(parts[k].float()) for (k, _), w in zip(self.items, self.weights)])
        total = torch.nansum(stacked, 0)
        return torch.where(torch.isnan(stacked).all(0), torch.full_like(total, float("nan")), total)


def standardize(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` [B] as (x - mean) / std over its finite entries (unbiased std; a constant batch or
    a single score gives 0); NaN and inf stay where they are."""
    ok = torch.isfinite(scores)
    if int(ok.sum()) < 2:
        return torch.where(ok, torch.zeros_like(scores), scores)
    x = scores[ok].double()
    std = float(x.std())
    if std == 0.0:
        return torch.where(ok, torch.zeros_like(scores), scores)
    return torch.where(ok, ((scores.double() - x.mean()) / std).to(scores.dtype), scores)


MESSAGES = "messages"  # a text sample's meta key holding its prompt as chat messages (TRL's conversational form)


class FunctionReward(Reward):
    """Any Python callable as a reward, as TRL takes them: ``fn(samples, prompts=[...], **columns)``
    returns one score per sample (a list of floats, a tensor or an array). ``samples`` are the
    completions (text), the uint8 images ``[B, H, W, 3]`` or the uint8 videos ``[B, F, H, W, 3]``;
    ``columns`` are the keys of the samples' ``meta`` (the dataset's ground truth and extra columns,
    e.g. ``answer``, ``solution``), each a list over the batch (None where a sample lacks it). ``fn``
    gets the keywords its signature names, or all of them if it takes ``**kwargs``. A None score
    (TRL's "does not apply") becomes NaN: in a weighted sum the other parts decide; alone, the
    episode is dropped and counted by the trainer.

    Completions take the form TRL gives them for the same data: strings for prompts that are strings
    (TRL's standard format); for prompts that are chat messages (TRL's conversational format: the
    dataset's samples carry them as ``meta["messages"]``) each completion is
    ``[{"role": "assistant", "content": text}]`` and ``prompts`` are the messages, so `trl.rewards`'
    functions (``completion[0]["content"]``) run unchanged.

    The function is user code: it runs under a time limit (`time_limit`, ``reward.timeout_s``:
    automatic by default, see `mmrl.utils.deadline`), and when it raises, runs past the limit or
    returns anything but one number (or None) per sample, `RewardFunctionError` says so in one line
    naming it by ``file:name`` (`where`)."""

    #: how the function's calls are limited; `mmrl.trainer.reward_stage.build_reward_stage` sets
    #: ``reward.timeout_s``'s
    time_limit: CallLimit

    def __init__(self, fn, kind: str, name: str | None = None, **bound):
        import inspect

        if not callable(fn):
            raise TypeError(f"a function reward needs a callable, got {type(fn).__name__}")
        check_kind(kind)
        self.fn, self.kind, self.bound = fn, kind, bound
        fn_name: str = getattr(fn, "__name__", type(fn).__name__)
        self.name = name or fn_name
        self.where = describe_callable(fn)
        self.time_limit = CallLimit(None, "reward.timeout_s")
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
        grad = torch.is_grad_enabled()  # thread-local: the limited call runs in its own thread

        def call():
            with torch.set_grad_enabled(grad):
                return self.fn(list(samples) if self.kind == "text" else samples, **kwargs)

        try:
            out = self.time_limit.call(call)
        except CallTimedOut as exc:
            raise RewardFunctionError(
                f"reward function {self.where} did not return within {exc.limit_s:g} s ({exc.why}) scoring "
                f"{_count(len(prompts), 'sample')}; it is left running and the run stops: fix the function, or "
                f"{self.time_limit.hint()}"
            ) from None
        except Exception as exc:
            hint = ""
            if isinstance(exc, (TypeError, IndexError, KeyError)) and self.kind == "text" and not conversational:
                hint = (
                    " (the completions are strings: the dataset's prompts are strings, TRL's standard format; "
                    "a reward that reads completion[0]['content'] needs conversational prompts, chat messages "
                    "[{'role': 'user', 'content': ...}] in the prompt column)"
                )
            elif "main thread" in str(exc):  # e.g. signal.alarm: the limited call runs in a thread of its own
                hint = (
                    f" (a time-limited function runs in a thread of its own; {self.time_limit.setting}=.inf runs "
                    "it in the caller's thread, without a limit)"
                )
            raise RewardFunctionError(
                f"reward function {self.where} raised {type(exc).__name__}: {_one_line(str(exc))} at "
                f"{_raised_at(exc, self.fn)} scoring {_count(len(prompts), 'sample')}{hint}; "
                f"fix the function{self._check_hint()}"
            ) from exc
        return self._scores(out, len(prompts))

    def _check_hint(self) -> str:
        """How to try the function alone (a top-level function of a .py file)."""
        file, _, name = self.where.rpartition(":")
        if not file.endswith(".py") or "." in name:
            return ""
        return f" (`mmrl check reward {self.where} kind={self.kind}` tries it on examples)"

    def _scores(self, out, n: int) -> torch.Tensor:
        """The function's answer ``out`` as float32 ``[n]`` (None = NaN), or `RewardFunctionError`
        saying what it returned and what was expected."""
        expected = (
            f"it must return one score per sample: a list of {_count(n, 'number')} (None where it does not apply), "
            f"or an array / tensor of shape ({n},)"
        )
        if isinstance(out, torch.Tensor) or (hasattr(out, "shape") and hasattr(out, "tolist")):  # an array
            shape = tuple(out.shape)
            if (len(shape) > 1 and sum(d != 1 for d in shape) > 1) or math.prod(shape) != n:
                raise RewardFunctionError(
                    f"reward function {self.where} returned a {type(out).__name__} of shape {shape} for "
                    f"{_count(n, 'sample')}; {expected}"
                )
            if isinstance(out, torch.Tensor):
                out = out.detach().cpu()
            values = out.reshape(-1).tolist() if hasattr(out, "reshape") else list(out.tolist())
        elif out is None or isinstance(out, (str, bytes, dict)) or not hasattr(out, "__iter__"):
            raise RewardFunctionError(
                f"reward function {self.where} returned {_preview(out)} ({type(out).__name__}) for "
                f"{_count(n, 'sample')}; {expected}"
            )
        else:
            values = list(out)
        if len(values) != n:
            raise RewardFunctionError(
                f"reward function {self.where} returned {_count(len(values), 'score')} for "
                f"{_count(n, 'sample')}; {expected}"
            )
        scores = []
        for i, v in enumerate(values):
            try:
                if isinstance(v, (str, bytes)):
                    raise TypeError
                scores.append(float("nan") if v is None else float(v))
            except (TypeError, ValueError):
                raise RewardFunctionError(
                    f"reward function {self.where} returned {_preview(v)} ({type(v).__name__}) as the score of "
                    f"sample {i} (of {_preview(out)}); scores must be numbers (float, int, bool) or None"
                ) from None
        return torch.tensor(scores, dtype=torch.float32)


def describe_callable(fn) -> str:
    """``file:name`` of a function (the file relative to the current folder when inside it), for
    messages; ``module:name`` for a callable without Python code (a builtin, a callable object)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__qualname__
    name = name.replace("<locals>.", "")
    code = _code_of(fn)
    if code is None:
        return f"{getattr(fn, '__module__', None) or type(fn).__module__}:{name}"
    return f"{_short_path(code.co_filename)}:{name}"


def _code_of(fn):
    """The code of a function, of a partial's function or of a callable object's ``__call__`` (None
    for a builtin)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__code__", None)
    if code is None and not isinstance(fn, type):
        code = getattr(vars(type(fn)).get("__call__"), "__code__", None)
    return code


def _short_path(filename: str) -> str:
    try:
        return str(Path(filename).resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return filename


def _raised_at(exc: BaseException, fn) -> str:
    """``file:line`` where ``exc`` was raised in ``fn``'s own file (its innermost frame there),
    and the innermost frame of all when that is elsewhere (a library the function called)."""
    frames = traceback.extract_tb(exc.__traceback__)
    code = _code_of(fn)
    own = [f for f in frames if code is not None and f.filename == code.co_filename]
    if not frames:
        return "an unknown line"
    inner = frames[-1]
    if not own:
        return f"{_short_path(inner.filename)}:{inner.lineno}"
    at = f"{_short_path(own[-1].filename)}:{own[-1].lineno}"
    return at if own[-1] is inner else f"{at} (in {_short_path(inner.filename)}:{inner.lineno})"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _preview(value) -> str:
    short = reprlib.Repr()
    short.maxstring, short.maxother, short.maxlist = 40, 40, 4
    return _one_line(short.repr(value), 120)


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
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # user code: one line naming the file and line, no traceback
            raise ValueError(_import_failure(f"reward file {path}", ref, exc, path)) from None
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            if exc.name is None or not where.startswith(exc.name):  # the module imports what is missing
                raise ValueError(_import_failure(f"module {where!r}", ref, exc)) from None
            raise ValueError(
                f"cannot import module {where!r} (from {ref!r}): {exc}; install it or give a file: "
                "'path/to/file.py:function'"
            ) from None
        except Exception as exc:
            raise ValueError(_import_failure(f"module {where!r}", ref, exc)) from None
    if not hasattr(module, attr):
        found = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise ValueError(f"{where} has no {attr!r} (from {ref!r}); callables there: {', '.join(found) or 'none'}")
    return getattr(module, attr)


def _import_failure(what: str, ref: str, exc: Exception, path: Path | None = None) -> str:
    """One line for code (``what``, the file ``path`` if known) that failed to import: a syntax
    error's file and line, or the exception and the innermost line of its traceback."""
    if isinstance(exc, SyntaxError):
        file = exc.filename
        same = file is None or (path is not None and Path(file).resolve() == path.resolve())
        at = f"line {exc.lineno}" if same or file is None else f"{_short_path(file)}:{exc.lineno}"
        return f"{what} has a syntax error at {at}: {exc.msg} (from {ref!r}); fix the file"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
    at = f" at {_short_path(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return f"{what} failed to import: {type(exc).__name__}: {_one_line(str(exc))}{at} (from {ref!r}); fix the file"


def as_reward(obj, kind: str, name: str | None = None, **bound) -> Reward:
    """A `Reward` from a Reward instance (returned as it is), a Reward class, or any callable
    (`FunctionReward`); ``bound`` keyword arguments go to a class's constructor or to the function."""
    if isinstance(obj, Reward):
        return obj
    if isinstance(obj, type) and issubclass(obj, Reward):
        return obj(**bound)
    return FunctionReward(obj, kind, name=name, **bound)
