"""Tools and conversation environments for multi-turn VLM episodes (`simulators.tool_env`).

A multi-turn episode is a conversation: the first messages (the question), then turns of the
policy (assistant messages) and of the environment (tool results, as ``role: "tool"`` messages),
until the policy answers without calling a tool. Each policy turn is one decision of the episode;
its loss covers that turn's own tokens only, the conversation before it being its prompt.

Tools are plain Python functions, as TRL's ``tools=[fn]`` takes them: typed arguments and a
Google-style docstring, which `transformers.utils.get_json_schema` turns into the JSON schema the
chat template's ``tools=`` lists (`Tool.from_function` fails in one line, before any work, on a
function without them). A tool returns text (``str``), an image (a PIL image, or a uint8
``[H, W, 3]`` numpy array or torch tensor) or a list of those; the result becomes the content of a
``tool`` message (`tool_content`). Calls are read from the policy's turn in the chat template's
tool-call format (Qwen / Hermes: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
`parse_tool_calls`).

Tools are user code: each call runs under a time limit (`mmrl.utils.deadline.CallLimit`, the rule
reward functions follow; ``tool_timeout_s``). A call that raises, runs past its limit, or returns
what a message cannot hold, and a turn whose call cannot be parsed or names no tool, raise
`ToolError`: the simulator ends that episode (counted, reward as configured), never the run. A call
past its limit is left running in its daemon thread (a Python thread cannot be killed): a tool must
not share state the run relies on.

Environments (`ChatEnv`, OpenEnv-like): ``reset(record) -> first messages`` and
``step(messages) -> EnvReply(new messages, reward, done)``. `ToolCallingEnv` is the default one:
the question as the user message, tools run as the policy calls them, an answer without a call
ends the episode (then scored by the trainer's reward stage). Subclass it for tools that read the
episode (its methods named in ``tool_methods`` are tools too, e.g. `simulators.tool_env.ZoomEnv`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mmrl.errors import UserError
from mmrl.utils.deadline import CallLimit, CallTimedOut

#: the chat template's tool-call markers (Qwen2.5 / Qwen3-VL / Hermes)
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


class ToolError(Exception):
    """A tool call that failed (raised, timed out, returned garbage) or could not be read from the
    policy's turn: ends its episode, counted as a tool error."""


@dataclass
class Tool:
    """A function the policy may call: its JSON ``schema`` (``{"type": "function", "function":
    {"name", "description", "parameters"}}``) and the time ``limit`` of each call."""

    fn: Callable[..., Any]
    schema: dict
    limit: CallLimit

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    @classmethod
    def from_function(
        cls, fn: Callable[..., Any], timeout_s: float | None = 30.0, setting: str = "tool_timeout_s"
    ) -> Tool:
        """The tool of a typed, documented function (a bound method too); `UserError` naming the
        function and the fix when its schema cannot be built. ``timeout_s``: each call's limit
        (`mmrl.utils.deadline.CallLimit`: None automatic, ``inf`` none); ``setting`` names its key."""
        from transformers.utils import get_json_schema

        name = getattr(fn, "__qualname__", repr(fn))
        try:
            schema = get_json_schema(fn)
        except Exception as exc:  # DocstringParsingException / TypeHintParsingException: one line
            raise UserError(
                f"tool {name}: {exc} Fix: give every argument a type hint and the function a Google-style "
                "docstring (a summary line, then 'Args:' with one 'name: description' line per argument)"
            ) from None
        return cls(fn, schema, CallLimit(timeout_s, setting))

    def __call__(self, arguments: dict) -> list[dict]:
        """Run the tool on ``arguments`` within its limit -> the content items of its message;
        `ToolError` when it raises, runs past the limit or returns what a message cannot hold."""
        try:
            value = self.limit.call(self.fn, **arguments)
        except CallTimedOut as exc:
            raise ToolError(f"tool '{self.name}' timed out: {exc}; {self.limit.hint()}") from None
        except Exception as exc:
            raise ToolError(f"tool '{self.name}' raised {type(exc).__name__}: {exc}") from None
        return tool_content(value, self.name)


def tool_content(value: Any, name: str = "tool") -> list[dict]:
    """A tool's return value -> content items of its ``tool`` message: ``str`` -> ``{"type": "text",
    "text"}``; a PIL image or uint8 ``[H, W, 3]`` array / tensor -> ``{"type": "image", "image": uint8
    tensor [H, W, 3]}``; a list or tuple -> its items' in order. Anything else: `ToolError`."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    out: list[dict[str, Any]] = []
    for v in items:
        if isinstance(v, str):
            out.append({"type": "text", "text": v})
            continue
        image = as_image(v)
        if image is None:
            shape = f" {getattr(v, 'dtype', '')} {list(v.shape)}" if hasattr(v, "shape") else ""
            raise ToolError(
                f"tool '{name}' returned {type(v).__name__}{shape}: a tool returns str, a PIL image, a uint8 "
                "[H, W, 3] array or tensor, or a list of those"
            )
        out.append({"type": "image", "image": image})
    return out


def as_image(v: Any) -> torch.Tensor | None:
    """``v`` as a uint8 ``[H, W, 3]`` CPU tensor (from PIL, numpy or torch), or None if it is not one."""
    if type(v).__module__.startswith("PIL."):
        import numpy as np

        v = np.asarray(v.convert("RGB"))
    if type(v).__module__ == "numpy":
        v = torch.from_numpy(v.copy()) if v.dtype.name == "uint8" else None
    if isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() == 3 and v.shape[-1] == 3 and v.numel():
        return v.cpu()
    return None


@dataclass
class ToolCall:
    name: str
    arguments: dict


_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The tool calls of a policy turn, in order (none: the turn is an answer). Each is
    ``<tool_call>{"name": str, "arguments": {...}}</tool_call>``; an unclosed call, a body that is
    not such JSON: `ToolError`."""
    bodies = _CALL.findall(text)
    if text.count(CALL_OPEN) != len(bodies) or text.count(CALL_CLOSE) != len(bodies):
        raise ToolError(f"unparseable tool call: unmatched {CALL_OPEN} / {CALL_CLOSE} in {text[-120:]!r}")
    calls = []
    for body in bodies:
        try:
            call = json.loads(body)
        except json.JSONDecodeError as exc:
            raise ToolError(f"unparseable tool call {body.strip()[:120]!r}: {exc}") from None
        args = call.get("arguments", {}) if isinstance(call, dict) else None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(args, dict):
            raise ToolError(f'a tool call is {{"name": str, "arguments": {{...}}}}, got {body.strip()[:120]!r}')
        calls.append(ToolCall(call["name"], args))
    return calls


@dataclass
class EnvReply:
    """An environment's answer to a policy turn: ``messages`` to append after it (tool results),
    the task ``reward`` of the turn, whether the episode is ``done`` (answered), and how many tool
    calls it ran (``tool_calls``)."""

    messages: list[dict] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    tool_calls: int = 0


class ChatEnv:
    """The environment of one conversation at a time (OpenEnv-like); a simulator holds one per env.

    ``reset(record)`` starts an episode on a dataset record (``prompt``, ``images``, ``videos``,
    ``meta``, ``solution``: `simulators.qa.QASim.record`) and returns its first messages;
    ``step(messages)`` takes the conversation so far, the policy's new turn last (``{"role":
    "assistant", "content": str}``), and returns an `EnvReply`. Raising `ToolError` (or anything
    else) ends the episode as an error. ``tools()`` lists what the chat template offers."""

    def tools(self) -> list[Tool]:
        return []

    def reset(self, record: dict) -> list[dict]:
        raise NotImplementedError

    def step(self, messages: list[dict]) -> EnvReply:
        raise NotImplementedError


def question_messages(record: dict, prompt: str = "{question}", system_prompt: str | None = None) -> list[dict]:
    """A record's question as the first messages: the optional system message, then one user
    message with its videos, its images (uint8 ``[H, W, 3]`` content items) and the text."""
    out: list[dict] = []
    if system_prompt:
        out.append({"role": "system", "content": [{"type": "text", "text": system_prompt}]})
    content = [{"type": "video", "video": v} for v in record.get("videos", [])]
    content += [{"type": "image", "image": im} for im in record.get("images", [])]
    content.append({"type": "text", "text": prompt.format(question=record["prompt"])})
    out.append({"role": "user", "content": content})
    return out


class ToolCallingEnv(ChatEnv):
    """Tools called as the policy asks; an answer without a call ends the episode (reward 0 here:
    the trainer's reward stage scores it).

    ``tools``: functions (`Tool.from_function` checks them); the methods named in the class's
    ``tool_methods`` are added (tools that read the episode); ``tool_timeout_s``: each call's limit."""

    tool_methods: tuple[str, ...] = ()

    def __init__(
        self,
        tools: list[Callable] = (),  # type: ignore[assignment]
        prompt: str = "{question}",
        system_prompt: str | None = None,
        tool_timeout_s: float | None = 30.0,
        setting: str = "tool_timeout_s",
    ):
        if "{question}" not in prompt:
            raise ValueError(f"prompt must contain the placeholder {{question}}, got {prompt!r}")
        fns = list(tools) + [getattr(self, m) for m in self.tool_methods]
        self._tools = [Tool.from_function(fn, tool_timeout_s, setting) for fn in fns]
        self.by_name = {t.name: t for t in self._tools}
        if len(self.by_name) != len(self._tools):
            names = [t.name for t in self._tools]
            raise ValueError(f"two tools share a name: {sorted({n for n in names if names.count(n) > 1})}")
        self.prompt, self.system_prompt = prompt, system_prompt

    def tools(self) -> list[Tool]:
        return list(self._tools)

    def reset(self, record: dict) -> list[dict]:
        return question_messages(record, self.prompt, self.system_prompt)

    def step(self, messages: list[dict]) -> EnvReply:
        turn = messages[-1]["content"]
        calls = parse_tool_calls(turn if isinstance(turn, str) else "".join(c.get("text", "") for c in turn))
        out = []
        for call in calls:
            tool = self.by_name.get(call.name)
            if tool is None:
                raise ToolError(
                    f"the turn calls tool '{call.name}', which does not exist (tools: {sorted(self.by_name)})"
                )
            out.append({"role": "tool", "name": call.name, "content": tool(call.arguments)})
        return EnvReply(out, done=not calls, tool_calls=len(calls))


__all__ = [
    "Tool",
    "ToolError",
    "ToolCall",
    "EnvReply",
    "ChatEnv",
    "ToolCallingEnv",
    "parse_tool_calls",
    "tool_content",
    "question_messages",
    "CALL_OPEN",
    "CALL_CLOSE",
]
