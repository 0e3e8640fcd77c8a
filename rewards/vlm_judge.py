"""VLM judge: ask a vision-language model a templated question about each image and its instruction.

``VLMJudge`` (registered as ``vlm_judge``) formats ``template.format(instruction=prompt)`` per sample,
sends the batch of (image, question) pairs to a backend and parses the answers:

- ``mode="yes_no"`` (default template `YES_NO_TEMPLATE`): ``yes -> 1.0``, ``no -> 0.0``. Accepts
  case, punctuation, markdown (``**Yes**``), a leading ``Answer:`` and trailing text (``Yes, the cube
  is lifted``); a reply that names only one of yes / no anywhere also counts.
- ``mode="score"`` (`SCORE_TEMPLATE`): a number in ``[0, max_score]`` divided by ``max_score``. Accepts
  ``7``, ``7.5``, ``7/10`` and ``8 out of 10`` (rescaled to ``max_score`` when the denominator
  differs), ``Score: 7``, ``seven``; out-of-range values are clamped.

Unparseable replies score ``fallback`` (default 0.0) and increment ``num_unparsed``; the last raw
replies are kept in ``last_answers``. Range [0, 1] (``fallback`` aside).

Backends (exactly one):

- ``generate_fn(images: list[PIL.Image], questions: list[str]) -> list[str]``: any callable (a local
  transformers VLM, a test stub); called once per batch (``batch_size`` chunks if set).
- ``base_url`` + ``model``: an OpenAI-compatible chat-completions server (vLLM, SGLang, OpenAI, ...),
  ``POST {base_url}/chat/completions`` with one request per image, each ``[image_url (base64 PNG data
  URL), text]`` as the user message, ``temperature=0``; up to ``concurrency`` requests in flight
  (standard library ``urllib.request``, no extra dependency). Failures raise `VLMJudgeError` naming
  the URL. Scoring from answer log-probabilities is out of scope.
"""

from __future__ import annotations

import base64
import io
import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from mmrl.reward import Reward, RewardError

YES_NO_TEMPLATE = "Task: {instruction}. Has the task been completed in this image? Answer yes or no."
SCORE_TEMPLATE = (
    "Task: {instruction}. Rate from 0 to 10 how well the task has been completed in this image. "
    "Answer with a single number."
)
MODES = ("yes_no", "score")

_YES = {"yes", "yeah", "yep", "true", "correct"}
_NO = {"no", "nope", "false", "incorrect"}
_NUMBER_WORDS = {w: float(i) for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}
_NUM = r"[-+]?\d+(?:\.\d+)?"
_LEAD = re.compile(r"^\s*(?:final\s+answer|answer|response|a|output|verdict|assistant)\s*[:\-]\s*", re.I)


class VLMJudgeError(RewardError):
    """The VLM judge backend failed (the message names the server URL for the HTTP backend)."""


# ----------------------------------------------------------------------------- parsing (pure)
def _clean(text: str) -> str:
    text = re.sub(r"[*_`#>]", " ", str(text))
    text = _LEAD.sub("", text.strip())
    return text.strip()


def parse_yes_no(text: str) -> float | None:
    """``1.0`` for yes, ``0.0`` for no, ``None`` when the reply says neither (or both)."""
    words = re.findall(r"[a-z]+", _clean(text).lower())
    if not words:
        return None
    if words[0] in _YES:
        return 1.0
    if words[0] in _NO:
        return 0.0
    yes, no = any(w in _YES for w in words), any(w in _NO for w in words)
    if yes != no:
        return 1.0 if yes else 0.0
    return None


def parse_score(text: str, max_score: float = 10.0) -> float | None:
    """A score in ``[0, max_score]`` (clamped) read from the reply, ``None`` when there is no number.

    Order: a number after ``score`` / ``rating``, else a fraction anywhere, else a number at the
    start, else the first number not part of a stated range (``from 0 to 10``), else a number word
    (``seven``). A fraction (``7/10``, ``4 out of 5``) is rescaled to ``max_score``.
    """
    clean = _clean(text).lower()
    value: float | None = None
    ratio = rf"({_NUM})(?:\s*(?:/|out\s+of)\s*({_NUM}))?"
    keyword = re.search(rf"(?:score|rating)\s*(?:is|of|:|=)?\s*{ratio}", clean)
    frac = keyword or re.search(rf"({_NUM})\s*(?:/|out\s+of)\s*({_NUM})", clean)
    if frac:
        value = float(frac.group(1))
        if frac.group(2) is not None and float(frac.group(2)) > 0:
            value = value / float(frac.group(2)) * max_score
    else:
        lead = re.match(rf"\s*({_NUM})\b", clean)
        if lead:
            value = float(lead.group(1))
        else:
            unranged = re.sub(rf"(?:from\s+|between\s+)?{_NUM}\s*(?:to|and|-)\s*{_NUM}", " ", clean)
            num = re.search(_NUM, unranged)
            if num:
                value = float(num.group(0))
            else:
                words = [w for w in re.findall(r"[a-z]+", clean) if w in _NUMBER_WORDS]
                value = _NUMBER_WORDS[words[0]] if words else None
    if value is None or not np.isfinite(value):
        return None
    return float(min(max(value, 0.0), max_score))


# ----------------------------------------------------------------------------- HTTP backend
def png_data_url(image) -> str:
    """A PIL image as a ``data:image/png;base64,...`` URL."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


class OpenAIChatBackend:
    """``generate_fn`` for an OpenAI-compatible ``/chat/completions`` server (standard library only)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_tokens: int = 16,
        temperature: float = 0.0,
        concurrency: int = 8,
        extra_body: dict | None = None,
    ):
        if not base_url or not model:
            raise ValueError("the HTTP VLM judge needs base_url (e.g. 'http://127.0.0.1:8000/v1') and model")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key, self.timeout = model, api_key, float(timeout)
        self.max_tokens, self.temperature = int(max_tokens), float(temperature)
        self.concurrency, self.extra_body = max(1, int(concurrency)), dict(extra_body or {})

    def body(self, image, question: str) -> dict:
        content = [{"type": "image_url", "image_url": {"url": png_data_url(image)}}, {"type": "text", "text": question}]
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            **self.extra_body,
        }

    def ask(self, image, question: str) -> str:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(self.body(image, question)).encode()
        request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = json.loads(response.read().decode())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise VLMJudgeError(f"VLM judge server {self.url} answered HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise VLMJudgeError(
                f"could not reach the VLM judge server {self.url} (timeout {self.timeout:g}s): {reason}"
            ) from exc
        except json.JSONDecodeError as exc:
            raise VLMJudgeError(f"VLM judge server {self.url} did not return JSON: {exc}") from exc
        try:
            content = payload["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise VLMJudgeError(
                f"VLM judge server {self.url} returned no choices[0].message.content: {str(payload)[:300]}"
            ) from exc
        if isinstance(content, list):  # some servers return content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return str(content or "")

    def __call__(self, images: list, questions: list[str]) -> list[str]:
        if self.concurrency == 1 or len(images) == 1:
            return [self.ask(i, q) for i, q in zip(images, questions)]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(images))) as pool:
            return list(pool.map(self.ask, images, questions))


# ----------------------------------------------------------------------------- the reward
class VLMJudge(Reward):
    """A VLM answers a templated yes/no or 0-10 question about image + instruction; parsed to [0, 1]."""

    name = "vlm_judge"
    kind = "image"

    def __init__(
        self,
        *,
        generate_fn: Callable[[list, list[str]], Sequence[str]] | None = None,
        base_url: str | None = None,
        model: str | None = None,
        mode: str = "yes_no",
        template: str | None = None,
        max_score: float = 10.0,
        fallback: float = 0.0,
        batch_size: int | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_tokens: int = 16,
        concurrency: int = 8,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
        if (generate_fn is None) == (base_url is None):
            raise ValueError(
                "VLMJudge needs exactly one backend: generate_fn=callable(images, questions) "
                "or base_url=... with model=... (an OpenAI-compatible server)"
            )
        if generate_fn is None:
            generate_fn = OpenAIChatBackend(
                base_url, model, api_key=api_key, timeout=timeout, max_tokens=max_tokens, concurrency=concurrency
            )
        elif not callable(generate_fn):
            raise ValueError(f"generate_fn must be callable, got {type(generate_fn).__name__}")
        template = template if template is not None else (YES_NO_TEMPLATE if mode == "yes_no" else SCORE_TEMPLATE)
        if "{instruction}" not in template:
            raise ValueError("template must contain '{instruction}' (where the prompt goes)")
        if not max_score > 0:
            raise ValueError(f"max_score must be > 0, got {max_score}")
        self.generate_fn, self.mode, self.template = generate_fn, mode, template
        self.max_score, self.fallback = float(max_score), float(fallback)
        self.batch_size = int(batch_size) if batch_size else None
        self.num_unparsed = 0
        self.last_answers: list[str] = []

    def question(self, prompt: str) -> str:
        return self.template.format(instruction=prompt)

    def parse(self, answer: str) -> float | None:
        """The answer as a score in [0, 1], or ``None`` when unparseable."""
        if self.mode == "yes_no":
            return parse_yes_no(answer)
        value = parse_score(answer, self.max_score)
        return None if value is None else value / self.max_score

    def ask(self, images: list, questions: list[str]) -> list[str]:
        step = self.batch_size or len(images)
        answers: list[str] = []
        for i in range(0, len(images), step):
            out = list(self.generate_fn(images[i : i + step], questions[i : i + step]))
            if len(out) != len(images[i : i + step]) or not all(isinstance(a, str) for a in out):
                raise VLMJudgeError(
                    f"the VLM judge backend must return {len(images[i : i + step])} strings, "
                    f"got {type(out).__name__} of {len(out)}"
                )
            answers += out
        return answers

    def score(self, images, prompts, meta) -> torch.Tensor:
        from PIL import Image

        pils = [Image.fromarray(a) for a in np.ascontiguousarray(images.cpu().numpy())]
        answers = self.ask(pils, [self.question(p) for p in prompts])
        self.last_answers = answers
        scores = []
        for answer in answers:
            value = self.parse(answer)
            if value is None:
                self.num_unparsed += 1
                value = self.fallback
            scores.append(value)
        return torch.tensor(scores, dtype=torch.float32)


__all__ = [
    "VLMJudge",
    "VLMJudgeError",
    "OpenAIChatBackend",
    "parse_yes_no",
    "parse_score",
    "png_data_url",
    "YES_NO_TEMPLATE",
    "SCORE_TEMPLATE",
]
