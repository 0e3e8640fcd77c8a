"""The rollout-engine contract: prompts (text + images) in, sampled completions with token log-probs out.

Engines sit behind one interface so the trainer does not care whether Hugging Face ``generate``
(CPU/GPU, `mmrl.engines.hf_engine`) or vLLM (`mmrl.engines.vllm_engine`) samples:

- ``generate(requests, sampling)`` -> one `Generation` per request and sample (``sampling.n`` per
  request, request-major: request 0's n samples first). A `GenRequest` carries the chat-templated
  prompt text exactly as the model's processor expects it (image placeholders not yet expanded) and
  the request's images as PIL images; the engine expands placeholders itself (HF processor / vLLM
  multi-modal data). ``token_ids`` are the sampled completion tokens (stop token included when one
  was sampled), ``logprobs`` their log-probabilities ``log_softmax(logits / temperature)``, one
  per token: the sampling temperature applied, top-k / top-p truncation not (what the trainer
  recomputes; at temperature 1 this is the raw model distribution).
- ``load_weights(named_tensors)`` pushes trainer weights (HF parameter names, merged LoRA or full)
  into the engine after an update; ``load_lora(path_or_state)`` pushes a LoRA adapter only.
- ``release_cache()`` frees per-step multi-modal / prefix caches so memory stays bounded.
- ``sleep()`` / ``wake()`` offload and restore the engine between phases (collocated placement).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class SamplingConfig:
    """Sampling parameters shared by every engine."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    max_new_tokens: int = 32
    seed: int | None = None
    #: tokens never sampled (e.g. image placeholders: a sampled one would take image features on recompute)
    banned_token_ids: tuple[int, ...] = ()


@dataclass
class GenRequest:
    """One prompt: chat-templated text, its images (PIL) and its videos (`mmrl.video.Clip`: frames
    already chosen), each in placeholder order."""

    text: str
    images: list = field(default_factory=list)
    videos: list = field(default_factory=list)


@dataclass
class Generation:
    """One sampled completion of request ``request_index``."""

    request_index: int
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (a stop token was sampled) or "length" (max_new_tokens reached)


class RolloutEngine:
    """Base class; see the module docstring."""

    name = "engine"

    def generate(self, requests: list[GenRequest], sampling: SamplingConfig) -> list[Generation]:
        raise NotImplementedError

    def load_weights(self, named_tensors: Iterable) -> None:
        raise NotImplementedError

    def load_lora(self, adapter) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not take LoRA-only updates; use load_weights")

    def release_cache(self) -> None:
        """Free per-step caches (default: nothing cached)."""

    def sleep(self) -> None:
        """Offload (default: nothing to do)."""

    def wake(self) -> None:
        """Restore after `sleep` (default: nothing to do)."""

    def close(self) -> None:
        """Release the engine."""
