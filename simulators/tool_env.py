"""ToolEnvSim: multi-turn visual question answering with tools (VLM RL), one decision per turn.

An episode is a conversation (`mmrl.tools`): ``reset`` deals each environment a question from a
VLM dataset (as `simulators.qa.QASim`: the same datasets, data order and evaluation split) and its
`mmrl.tools.ChatEnv` turns it into the first messages (``Observation.messages``, with the tools'
JSON schemas in ``Observation.tools`` for the chat template; ``schemas_in_prompt=False`` leaves the
template's tools turn out, for a policy that learns the tools from demonstrations and a prompt that
names them: the tiny CPU demo's prompts shrink from ~790 tokens to ~150). Each step takes the policy's turns
(`mmrl.simulator.Completions`):

- a turn with tool calls (``<tool_call>{"name", "arguments"}</tool_call>``): the calls run (each
  under ``tool_timeout_s``), the turn and the tool results (text or images, ``role: "tool"``) are
  appended, the episode goes on;
- a turn without a call is the answer: the episode ends (``terminated``) and the trainer's reward
  stage scores it against the question's ``meta``, as it scores `QASim`'s answers (the ``reward:``
  section, e.g. ``short_answer``); the tool-call turns are not scored;
- a failed tool (raises, runs past its limit, returns garbage, an unparseable call or an unknown
  tool) or an environment that raises ends the episode (``truncated``), counted, with reward 0: set
  ``reward.combine.failure_term: truncated`` and ``failure_penalty`` for another value;
- caps: a turn that reaches ``max_turns`` or brings the episode's generated tokens
  (``Completions.num_tokens``, the model's own) to ``max_total_tokens`` without answering ends the
  episode (``truncated``), counted.

Per-step ``info`` (each ``[N]``; the collector records ``num_steps``, so ``train/length`` is the
turns per episode): ``num_steps`` (1: a turn), ``tool_calls`` (calls run in this turn),
``tool_errors`` (1 where a tool failed), ``env_errors`` (1 where the environment itself raised),
``capped`` (bool: a cap ended the episode), ``turns`` (the episode's turns so far), and per env
``errors`` (the failure's one line, or None) and ``answers``.

Environments (``env``): ``tools`` (`mmrl.tools.ToolCallingEnv`: the ``tools`` functions, given as
``module:function`` / ``file.py:function`` references or callables), ``zoom`` (`ZoomEnv`: the
question image shown small, a ``zoom(x, y)`` tool returning the full-resolution crop), or a
``module:Class`` reference to a user's `mmrl.tools.ChatEnv` (OpenEnv-like ``reset`` / ``step``),
built with ``env_kwargs``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mmrl.simulator import Completions, Observation, StepResult, reset_seeds
from mmrl.tools import ChatEnv, EnvReply, ToolCallingEnv, ToolError, question_messages

from .qa import QASim, grayscale, thumbnail


class ZoomEnv(ToolCallingEnv):
    """The question's first image shown at ``show_size`` px; the ``zoom`` tool returns the
    ``crop_size`` px full-resolution square around a point of the small image (clamped inside).
    ``display_size`` (default ``show_size``): the small image is sent blown up to this many px, each
    of its pixels a block (nearest neighbour: no more detail, only more vision tokens for it).
    ``offer_zoom=False`` offers no tool (the no-tool baseline: answer from the small image).
    ``gray=True`` shows the small image in grayscale (BT.601 luma in all three channels); the crops
    keep their colour (zoom_vqa's ``question="color"``: the overview shows where, the crop what)."""

    tool_methods = ("zoom",)
    # {view} / {crop}: "" or, with gray, " in grayscale" / " in color"
    PROMPT = (
        "{question} The image is shown at {size} x {size} px{view}: call zoom(x, y) to see the part around "
        "column x, row y{crop} at full resolution."
    )
    PROMPT_NO_TOOL = "{question} The image is shown at {size} x {size} px{view}."

    def __init__(
        self,
        tools=(),
        show_size: int = 16,
        crop_size: int = 24,
        prompt: str | None = None,
        offer_zoom: bool = True,
        display_size: int | None = None,
        gray: bool = False,
        **kw,
    ):
        display_size = show_size if display_size is None else display_size
        if show_size < 1 or crop_size < 1 or display_size % show_size:
            raise ValueError(
                f"show_size and crop_size must be >= 1 and display_size a multiple of show_size, got {show_size}, "
                f"{crop_size}, {display_size}"
            )
        self.show_size, self.crop_size, self.display_size = int(show_size), int(crop_size), int(display_size)
        if not offer_zoom:
            self.tool_methods = ()
        self.gray = bool(gray)
        if not prompt:
            fill = {
                "{size}": str(self.show_size),
                "{view}": " in grayscale" * self.gray,
                "{crop}": " in color" * self.gray,
            }
            prompt = self.PROMPT if offer_zoom else self.PROMPT_NO_TOOL
            for key, value in fill.items():  # {question} stays for question_messages
                prompt = prompt.replace(key, value)
        super().__init__(tools, prompt=prompt, **kw)
        self.full: torch.Tensor | None = None  # uint8 [H, W, 3] of the episode's image

    def reset(self, record: dict) -> list[dict]:
        if not record["images"]:
            raise ValueError(f"the zoom environment needs a question with an image: {record['prompt']!r} has none")
        self.full = record["images"][0]
        shown = thumbnail(self.full, self.show_size)
        if self.gray:  # the luma zoom_vqa's colour question equalises
            shown = grayscale(shown)
        k = self.display_size // self.show_size
        shown = shown.repeat_interleave(k, 0).repeat_interleave(k, 1)
        return question_messages({**record, "images": [shown]}, self.prompt, self.system_prompt)

    def zoom(self, x: int, y: int):
        """See the image around a point at full resolution.

        Args:
            x: column in the small image (0: left)
            y: row in the small image (0: top)
        """
        assert self.full is not None, "reset starts an episode before its tools are called"
        h, w = self.full.shape[:2]
        c = min(self.crop_size, h, w)
        x0 = min(max(round((int(x) + 0.5) * w / self.show_size - c / 2), 0), w - c)
        y0 = min(max(round((int(y) + 0.5) * h / self.show_size - c / 2), 0), h - c)
        return self.full[y0 : y0 + c, x0 : x0 + c].clone()


#: built-in environments (``env``): name -> class
ENVS: dict[str, type[ChatEnv]] = {"tools": ToolCallingEnv, "zoom": ZoomEnv}


def make_env(env: str, tools: list[Callable], tool_timeout_s: float | None, env_kwargs: dict) -> ChatEnv:
    """One `ChatEnv`: a built-in (`ENVS`) or a ``module:Class`` reference; a `ToolCallingEnv` gets
    the ``tools`` and their time limit."""
    if env in ENVS:
        cls = ENVS[env]
    else:
        from mmrl.reward import import_reference

        if ":" not in env:
            raise ValueError(f"env {env!r}: use one of {sorted(ENVS)} or a 'module.path:Class' reference")
        cls = import_reference(env)
    if not (isinstance(cls, type) and issubclass(cls, ChatEnv)):
        raise ValueError(f"env {env!r} is {cls!r}, not a mmrl.tools.ChatEnv class (reset / step)")
    if issubclass(cls, ToolCallingEnv):
        return cls(tools=tools, tool_timeout_s=tool_timeout_s, setting="sim.kwargs.tool_timeout_s", **env_kwargs)
    if tools:
        raise ValueError(f"sim.kwargs.tools given, but env {env!r} is not a ToolCallingEnv: its tools are its own")
    return cls(**env_kwargs)


class ToolEnvSim(QASim):
    """Question -> turns with tool calls -> answer scored by the reward stage; see the module docstring."""

    action_type = "text"
    has_success = False  # success is the reward stage's threshold
    episode_counters = ("tool_calls", "tool_errors", "env_errors", "capped")  # per episode: train/<name>

    def __init__(
        self,
        num_envs: int = 8,
        dataset: str = "zoom_vqa",
        dataset_kwargs: dict | None = None,
        split: str = "train",
        env: str = "tools",
        env_kwargs: dict | None = None,
        tools: list | tuple = (),
        tool_timeout_s: float | None = 30.0,
        max_turns: int = 4,
        max_total_tokens: int = 1024,
        thumb_size: int = 64,
        shuffle_seed: int = 0,
        device: str | torch.device = "cpu",
        seed: int = 0,
        schemas_in_prompt: bool = True,
    ):
        if max_turns < 1 or max_total_tokens < 1:
            raise ValueError(f"max_turns and max_total_tokens must be >= 1, got {max_turns}, {max_total_tokens}")
        from mmrl.reward import import_reference

        fns = [import_reference(t) if isinstance(t, str) else t for t in tools]
        bad = [t for t in fns if not callable(t)]
        if bad:
            raise ValueError(f"sim.kwargs.tools must be functions or 'module:function' references, got {bad}")
        make = lambda: make_env(env, fns, tool_timeout_s, dict(env_kwargs or {}))  # noqa: E731
        self._probe = make()  # checks the tools (one line per bad one) before the dataset is built
        super().__init__(num_envs, dataset, dataset_kwargs, split, thumb_size, shuffle_seed, device, seed)
        self.max_episode_steps = self.max_turns = int(max_turns)
        self.max_total_tokens = int(max_total_tokens)
        self.envs = [make() for _ in range(self.num_envs)]
        # the chat template's tools turn; without it (schemas_in_prompt=False) the tools still run when called
        self.tool_schemas = [t.schema for t in self._probe.tools()] if schemas_in_prompt else []
        n = self.num_envs
        self._messages: list[list[dict]] = [[] for _ in range(n)]
        self._turns = torch.zeros(n, dtype=torch.long)
        self._tokens = torch.zeros(n, dtype=torch.long)

    # ------------------------------------------------------------------ episodes
    def record(self, i: int) -> dict:
        """Question ``i`` (`QASim.record`) with its first ``messages`` and the ``tools`` schemas."""
        rec = super().record(i)
        return {**rec, "messages": self._probe.reset(rec), "tools": list(self.tool_schemas)}

    def _start(self, rows: list[int]) -> None:
        """Start the episodes of envs ``rows`` on their questions (``self._idx``)."""
        for r in rows:
            self._messages[r] = self.envs[r].reset(QASim.record(self, int(self._idx[r])))
            self._turns[r] = self._tokens[r] = 0

    def _obs(self) -> Observation:
        obs = super()._obs()
        obs.messages = [list(m) for m in self._messages]
        obs.tools = [list(self.tool_schemas) for _ in range(self.num_envs)]
        return obs

    def reset(self, seed: int | list[int] | None = None) -> Observation:
        seeds, self._next_seed = reset_seeds(seed, self.num_envs, self._next_seed)
        self._idx = self.question_index(seeds)
        self._start(list(range(self.num_envs)))
        return self._obs()

    def _turn(self, i: int, text: str) -> tuple[EnvReply | None, str | None, str | None]:
        """Env ``i``'s answer to the policy's turn ``text``: (reply, error kind, error line)."""
        self._messages[i].append({"role": "assistant", "content": text})
        try:
            reply = self.envs[i].step(list(self._messages[i]))
        except ToolError as exc:
            return None, "tool_errors", str(exc)
        except Exception as exc:  # the environment is user code too: its episode ends, not the run
            return None, "env_errors", f"env {type(self.envs[i]).__name__}.step raised {type(exc).__name__}: {exc}"
        if not isinstance(reply, EnvReply):
            return (
                None,
                "env_errors",
                f"env {type(self.envs[i]).__name__}.step returned {type(reply).__name__}, not EnvReply",
            )
        return reply, None, None

    def step_chunk(self, actions: Completions, trace: bool = False) -> StepResult:
        """One turn of every env (see the module docstring); ended episodes restart on the next questions."""
        self.check_answers(actions)
        n, dev = self.num_envs, self.device
        tokens = actions.num_tokens if isinstance(actions, Completions) else [0] * n
        reward = torch.zeros(n)
        terminated, truncated, capped = (torch.zeros(n, dtype=torch.bool) for _ in range(3))
        counts = {k: torch.zeros(n, dtype=torch.long) for k in ("tool_calls", "tool_errors", "env_errors")}
        errors: list[str | None] = [None] * n
        for i, text in enumerate(actions):
            self._turns[i] += 1
            self._tokens[i] += int(tokens[i])
            reply, kind, errors[i] = self._turn(i, text)
            if reply is None:
                assert kind is not None
                counts[kind][i] = 1
                truncated[i] = True
                continue
            self._messages[i].extend(reply.messages)
            counts["tool_calls"][i] = reply.tool_calls
            reward[i] = float(reply.reward)
            if reply.done:
                terminated[i] = True
            elif self._turns[i] >= self.max_turns or self._tokens[i] >= self.max_total_tokens:
                truncated[i] = capped[i] = True
        turns = self._turns.clone()
        done = terminated | truncated
        final = self._obs()  # the conversations as they ended
        rows = done.nonzero().flatten().tolist()
        if rows:  # auto reset: the next questions, as QASim draws them
            self._idx[rows] = self.question_index([self._next_seed + r for r in rows])
            self._start(rows)
        self._next_seed += n
        info = {
            "num_steps": torch.ones(n, dtype=torch.long, device=dev),
            **{k: v.to(dev) for k, v in counts.items()},
            "capped": capped.to(dev),
            "turns": turns.to(dev),
            "errors": errors,
            "answers": list(actions),
        }
        no_success = torch.zeros(n, dtype=torch.bool, device=dev)
        return StepResult(self._obs(), reward.to(dev), terminated.to(dev), truncated.to(dev), no_success, final, info)

    def get_state(self) -> dict:
        raise NotImplementedError("a conversation's environments (user code) cannot be snapshotted")

    def set_state(self, state: dict) -> None:
        raise NotImplementedError("a conversation's environments (user code) cannot be snapshotted")


__all__ = ["ToolEnvSim", "ZoomEnv", "ENVS", "make_env"]
