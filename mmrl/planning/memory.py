"""The memory plan's arithmetic: pure functions from a `Workload` (numbers only) to bytes per device.

Nothing here imports torch or builds a model: `mmrl.planning.estimate` turns an experiment config into
a `Workload` (exact parameter counts from the real classes built on the meta device, shapes from the
model's architecture), and these functions price it. Every term is per device (one training rank).

Terms (``B`` = bytes):

* ``weights``: ``params x weight_bytes``, the policy's module (frozen parts included), its trainable
  parameters at ``train_bytes`` where that differs (a diffusers pipeline loaded in bf16 keeps its LoRA
  adapters, or a full fine-tune's transformer, in float32); sharded over the ranks by FSDP2 and by
  DeepSpeed ZeRO-3; plus the bytes of the module's floating-point buffers (``buffer_bytes``: SD3's
  positional table), never sharded. Frozen pipeline components that live outside the module (a diffusers pipeline's text
  encoders and VAE) are the separate term ``frozen encoders``, never sharded.
* ``gradients``: ``trainable x grad_bytes`` (the trainable weights' dtype: fp32 for LoRA adapters,
  which peft keeps in fp32 over a bf16 model; 2 under DeepSpeed bf16 / fp16); sharded by FSDP2 and
  ZeRO-2/3.
* ``optimizer``: Adam's two moments per trainable parameter, in the parameter's dtype for the torch
  and FSDP2 engines (torch's Adam keeps ``exp_avg`` / ``exp_avg_sq`` like the parameter), and, under
  DeepSpeed with bf16 / fp16 weights, fp32 moments plus DeepSpeed's fp32 master copy: 12 bytes per
  trainable parameter. Sharded by FSDP2 and ZeRO-1/2/3; zero on the device with
  ``offload_optimizer``.
* ``reference``: extra copies of weights the objective keeps (a frozen reference copy, an EMA or
  DiffusionNFT's old policy), at the trainable weights' dtype; a LoRA reference (the adapter switched
  off) costs nothing.
* ``rollout``: the rollout engine: the KV cache of generation
  (``rows x seq x layers x kv_heads x head_dim x 2 (K and V) x bytes``), or the share of the device
  vLLM reserves (``gpu_memory_utilization``), plus what a rollout stores (a flow chain).
* ``activations``: what autograd keeps for the backward of one minibatch's forward, per transformer
  stack, by `block_activation_elements` (see there for the formula and its assumptions): all layers
  without gradient checkpointing, else one saved input per layer plus one layer recomputed; a stack
  no trainable parameter depends on keeps nothing. Plus the fp32 logits of the completion tokens
  (``rows x tokens x vocab x 4 x 3``: the logits, their log-softmax and the gradient).

The estimate is an estimate: allocator fragmentation, CUDA context (~0.5-1 GiB), kernels' workspaces
and temporaries are not counted, so a plan that fits with no margin may still run out of memory.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
_SIZE_RE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B?|B)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


def parse_bytes(text: str | int | float) -> int:
    """``"80GiB"`` / ``"80GB"`` / ``"512MiB"`` / ``"1.5G"`` / a number of bytes -> bytes. ``Gi``/``GiB``
    are powers of 1024; ``G``/``GB`` are powers of 1000 (as GPU vendors write them)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return int(text)
    m = _SIZE_RE.fullmatch(str(text))
    if m is None:
        raise ValueError(f"memory size {text!r} is not a size: write e.g. 80GiB, 24GB, 512MiB or a number of bytes")
    value, unit = float(m.group(1)), (m.group(2) or "").lower()
    scale = 1024 ** "bkmgt".index(unit[0]) if unit.endswith(("i", "ib")) else _UNITS[unit[:1]]
    return int(value * scale)


@dataclass(frozen=True)
class Stack:
    """A stack of transformer blocks whose activations the backward keeps.

    ``tokens``: tokens per training row through this stack; ``kv_dim``: kv_heads x head_dim;
    ``ffn``: the MLP's inner width; ``gated``: a gated MLP (SwiGLU / GeGLU: gate and up) or a plain
    one; ``context``: tokens of a cross-attention context per row (0: none); ``trains``: some
    trainable parameter is in or before it (else autograd keeps nothing of it)."""

    name: str
    layers: int
    hidden: int
    kv_dim: int
    ffn: int
    tokens: int
    gated: bool = True
    context: int = 0
    trains: bool = True


@dataclass(frozen=True)
class KVCache:
    """A generation KV cache: ``rows`` sequences of ``seq`` tokens over ``layers`` layers."""

    rows: int
    seq: int
    layers: int
    kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class Workload:
    """Everything the plan prices, as numbers (see the module docstring for the terms).

    ``params`` / ``trainable``: the policy module's parameters (exact counts); ``train_bytes``: bytes
    per trainable parameter where they differ from ``weight_bytes`` (None: the same); ``buffer_bytes``:
    the module's floating-point buffers, in bytes; ``outside``: parameters of frozen components outside the
    module; ``copies``: parameters in extra copies
    (reference, EMA, old policy); ``train_rows``: rows of one minibatch on this rank, times
    ``rows_factor`` model rows each (times trained per sample, x2 for classifier-free guidance)."""

    model: str
    params: int
    trainable: int
    weight_bytes: int
    act_bytes: int
    world: int = 1
    backend: str = "torch"
    zero_stage: int = 0
    offload_optimizer: bool = False
    offload_params: bool = False
    outside: int = 0
    outside_bytes: int = 4
    copies: int = 0
    train_bytes: int | None = None
    buffer_bytes: int = 0
    stacks: tuple[Stack, ...] = ()
    train_rows: int = 1
    rows_factor: int = 1
    checkpointing: bool = False
    logits: tuple[int, int] | None = None  # (tokens per row, vocab): fp32 logits of the trained tokens
    kv_cache: KVCache | None = None
    engine_fraction: float | None = None  # vLLM: the share of the device its engine reserves
    rollout_bytes: int = 0  # what a rollout stores on the device besides the cache (a flow chain)
    minibatch: int = 1  # the configured minibatch (all ranks), for the knobs
    lora_trainable: int | None = None  # trainable parameters with LoRA instead (a full fine-tune's knob)
    notes: tuple[str, ...] = ()
    keys: dict[str, str] = field(default_factory=dict)  # knob -> the config key that sets it


def _half_master(w: Workload) -> bool:
    """DeepSpeed with half weights keeps an fp32 master copy and fp32 moments."""
    return w.backend == "deepspeed" and w.weight_bytes == 2


def shards(w: Workload) -> dict[str, int]:
    """The divisor of each shardable term over ``w.world`` ranks: FSDP2 shards weights, gradients and
    optimizer state; ZeRO-1 the optimizer state, ZeRO-2 also gradients, ZeRO-3 also weights."""
    n = max(w.world, 1)
    if w.backend == "fsdp":
        return {"weights": n, "gradients": n, "optimizer": n}
    if w.backend == "deepspeed":
        s = w.zero_stage
        return {"weights": n if s >= 3 else 1, "gradients": n if s >= 2 else 1, "optimizer": n if s >= 1 else 1}
    return {"weights": 1, "gradients": 1, "optimizer": 1}


def train_bytes(w: Workload) -> int:
    """Bytes per trainable parameter (its weight, its gradient, each Adam moment)."""
    return w.weight_bytes if w.train_bytes is None else w.train_bytes


def weights_bytes(w: Workload) -> int:
    if w.offload_params:
        return 0
    module = (w.params - w.trainable) * w.weight_bytes + w.trainable * train_bytes(w)
    return math.ceil(module / shards(w)["weights"]) + w.buffer_bytes


def gradients_bytes(w: Workload) -> int:
    if w.offload_params and w.backend == "fsdp":  # CPUOffloadPolicy keeps gradients on the CPU too
        return 0
    return math.ceil(w.trainable * train_bytes(w) / shards(w)["gradients"])


def optimizer_bytes(w: Workload) -> int:
    """Adam: two moments per trainable parameter (in its dtype), or 12 bytes (fp32 moments and master
    copy) under DeepSpeed with half weights."""
    if w.offload_optimizer or (w.offload_params and w.backend == "fsdp"):
        return 0
    per = 12 if _half_master(w) else 2 * train_bytes(w)
    return math.ceil(w.trainable * per / shards(w)["optimizer"])


def kv_cache_bytes(cache: KVCache | None, dtype_bytes: int) -> int:
    """``rows x seq x layers x kv_heads x head_dim x 2 (K, V) x bytes``."""
    if cache is None:
        return 0
    return cache.rows * cache.seq * cache.layers * cache.kv_heads * cache.head_dim * 2 * dtype_bytes


def block_activation_elements(s: Stack, rows: int) -> int:
    """Elements one block keeps for its backward at ``rows`` rows of ``s.tokens`` tokens, for a
    pre-norm block with fused (flash / SDPA memory-efficient) attention, so no ``tokens^2`` score
    matrix is kept:

        6 h            block input, norm output, q, attention output, residual, second norm output
        + 2 kv_dim     k and v
        + 4 ffn        gated MLP: gate, up, act(gate), act(gate) * up   (plain MLP: 2 ffn, fc1 and act)
        + 4 h          with cross-attention: its norm output, q, output and residual
        + 2 kv_dim x context / tokens    its k and v over the context

    per token (after Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models", with flash attention and no dropout). Not counted: fp32 copies inside norms, adaLN
    modulation vectors, rotary tables, kernels' temporaries."""
    t = rows * s.tokens
    per_token = 6 * s.hidden + 2 * s.kv_dim + (4 if s.gated else 2) * s.ffn
    cross = 0
    if s.context:
        per_token += 4 * s.hidden
        cross = rows * s.context * 2 * s.kv_dim
    return t * per_token + cross


def stack_activation_bytes(s: Stack, rows: int, checkpointing: bool, dtype_bytes: int) -> int:
    """All ``s.layers`` blocks' activations, or with gradient checkpointing one saved input per
    block (``rows x tokens x hidden``) plus one block recomputed in the backward."""
    if not s.trains or rows <= 0:
        return 0
    block = block_activation_elements(s, rows)
    if checkpointing:
        return (s.layers * rows * s.tokens * s.hidden + block) * dtype_bytes
    return s.layers * block * dtype_bytes


def activations_bytes(w: Workload) -> int:
    rows = w.train_rows * w.rows_factor
    total = sum(stack_activation_bytes(s, rows, w.checkpointing, w.act_bytes) for s in w.stacks)
    if w.logits is not None:
        tokens, vocab = w.logits
        total += w.train_rows * tokens * vocab * 4 * 3
    return total


def rollout_bytes(w: Workload, device_memory: int) -> int:
    if w.engine_fraction is not None:
        return int(w.engine_fraction * device_memory) + w.rollout_bytes
    return kv_cache_bytes(w.kv_cache, w.act_bytes) + w.rollout_bytes


def terms(w: Workload, device_memory: int) -> dict[str, int]:
    """Bytes per device of each term, in the table's order."""
    return {
        "weights": weights_bytes(w),
        "frozen encoders": w.outside * w.outside_bytes,
        "gradients": gradients_bytes(w),
        "optimizer": optimizer_bytes(w),
        "reference": math.ceil(w.copies * train_bytes(w) / shards(w)["weights"]),
        "rollout": rollout_bytes(w, device_memory),
        "activations": activations_bytes(w),
    }


@dataclass(frozen=True)
class Knob:
    """A change that lowers the plan: the config overrides, in words, and the bytes it saves."""

    change: str
    saves: int
    fits: bool


@dataclass(frozen=True)
class Plan:
    workload: Workload
    device_memory: int
    terms: dict[str, int]
    knobs: tuple[Knob, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.terms.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.device_memory

    @property
    def largest(self) -> str:
        return max(self.terms, key=lambda k: self.terms[k])


def candidate_knobs(w: Workload, device_memory: int) -> list[tuple[str, Workload]]:
    """Changes worth trying, each as (its overrides in words, the changed workload); a smaller
    minibatch and more ranks go as far as needed to fit (halving / doubling), or to their limit."""
    out: list[tuple[str, Workload]] = []
    k = w.keys
    if w.lora_trainable is not None and "lora" in k:
        lora = dataclasses.replace(w, trainable=w.lora_trainable, copies=0, lora_trainable=None, train_bytes=4)
        out.append((k["lora"], lora))  # adapters in fp32 whatever the model's dtype (peft's default)
    if not w.checkpointing and w.stacks and "checkpointing" in k:
        out.append((f"{k['checkpointing']}=true", dataclasses.replace(w, checkpointing=True)))
    if w.weight_bytes == 4 and "half_weights" in k:  # a pipeline loaded in bf16, its trained weights kept fp32
        half = dataclasses.replace(w, weight_bytes=2, outside_bytes=min(w.outside_bytes, 2), act_bytes=2)
        out.append((k["half_weights"], dataclasses.replace(half, train_bytes=train_bytes(w))))
    if w.act_bytes == 4 and w.stacks:
        out.append(("trainer.engine.precision=bf16", dataclasses.replace(w, act_bytes=2)))
    if w.train_rows > 1 and "minibatch" in k:
        smaller = _until_fits(w, device_memory, lambda v: v.train_rows > 1, _halve_minibatch)
        out.append((f"{k['minibatch']}={smaller.minibatch}", smaller))
    if w.kv_cache is not None and w.kv_cache.rows > 1 and "rollout_rows" in k:
        cache = dataclasses.replace(w.kv_cache, rows=max(w.kv_cache.rows // 2, 1))
        out.append((k["rollout_rows"], dataclasses.replace(w, kv_cache=cache)))
    if w.engine_fraction is not None and w.engine_fraction > 0.3 and "engine_fraction" in k:
        out.append((f"{k['engine_fraction']}=0.3", dataclasses.replace(w, engine_fraction=0.3)))
    if w.trainable and w.backend == "torch":
        out.append(("trainer.engine.backend=deepspeed trainer.engine.offload_optimizer=true", _offloaded(w)))
    if w.trainable:
        start = dataclasses.replace(w, backend="fsdp") if w.backend == "torch" else w
        more = _until_fits(start, device_memory, lambda v: v.world < MAX_RANKS, _double_ranks)
        engine = "trainer.engine.backend=fsdp on " if w.backend == "torch" else ""
        out.append((f"{engine}{more.world} ranks (torchrun --nproc_per_node {more.world})", more))
    return out


MAX_RANKS = 64  # the most ranks the knobs suggest


def _halve_minibatch(w: Workload) -> Workload:
    return dataclasses.replace(w, train_rows=max(w.train_rows // 2, 1), minibatch=max(w.minibatch // 2, 1))


def _double_ranks(w: Workload) -> Workload:
    return dataclasses.replace(w, world=w.world * 2, train_rows=max(w.train_rows // 2, 1))


def _until_fits(w: Workload, device_memory: int, can, step) -> Workload:
    """``step`` applied to ``w`` until the plan fits or ``can`` says no more (at least once)."""
    w = step(w)
    while sum(terms(w, device_memory).values()) > device_memory and can(w):
        w = step(w)
    return w


def _offloaded(w: Workload) -> Workload:
    return dataclasses.replace(w, backend="deepspeed", zero_stage=max(w.zero_stage, 1), offload_optimizer=True)


def make_plan(w: Workload, device_memory: int) -> Plan:
    """The plan of ``w`` on a device of ``device_memory`` bytes; when it does not fit, the knobs that
    lower it, the largest saving first (each alone, from this plan)."""
    now = terms(w, device_memory)
    total = sum(now.values())
    knobs: list[Knob] = []
    if total > device_memory:
        for change, changed in candidate_knobs(w, device_memory):
            after = sum(terms(changed, device_memory).values())
            if after < total:
                knobs.append(Knob(change, total - after, after <= device_memory))
        knobs.sort(key=lambda kb: -kb.saves)
    return Plan(w, device_memory, now, tuple(knobs))


def gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def render(plan: Plan) -> str:
    """The plan as a table: term, GiB, share of the total; the total, the device, fits, the knobs."""
    w, total = plan.workload, plan.total
    lines = [
        f"memory plan per device (an estimate, not a measurement): {w.model}",
        f"  parameters {w.params:,} in the policy ({w.trainable:,} trainable)"
        + (f", {w.outside:,} in frozen encoders" if w.outside else "")
        + f"; {w.world} rank(s), engine {w.backend}"
        + (f" ZeRO-{w.zero_stage}" if w.backend == "deepspeed" else ""),
        f"  {'term':<16}{'GiB':>10}{'share':>9}",
    ]
    for name, value in plan.terms.items():
        share = f"{100 * value / total:.1f}%" if total else "-"
        lines.append(f"  {name:<16}{gib(value):>10}{share:>9}")
    lines.append(f"  {'total':<16}{gib(total):>10}")
    lines.append(f"  device memory {gib(plan.device_memory)} GiB: fits {'yes' if plan.fits else 'no'}")
    lines += [f"  note: {n}" for n in w.notes]
    if not plan.fits:
        if plan.knobs:
            lines.append("  what would lower it (each alone, largest saving first):")
            lines += [
                f"    {kb.change}: saves {gib(kb.saves)} GiB{' (then fits)' if kb.fits else ''}" for kb in plan.knobs
            ]
        else:
            lines.append("  no knob mmrl knows lowers this plan: a device with more memory")
    return "\n".join(lines)


def as_json(plan: Plan) -> dict:
    """The plan as one JSON-able object (bytes as integers)."""
    w = plan.workload
    return {
        "model": w.model,
        "params": w.params,
        "trainable": w.trainable,
        "frozen_encoder_params": w.outside,
        "world_size": w.world,
        "backend": w.backend,
        "terms": dict(plan.terms),
        "total": plan.total,
        "device_memory": plan.device_memory,
        "fits": plan.fits,
        "largest": plan.largest,
        "knobs": [{"change": kb.change, "saves": kb.saves, "fits": kb.fits} for kb in plan.knobs],
        "notes": list(w.notes),
        "estimate": True,
    }


def refusal(plan: Plan) -> str:
    """One line for ``mmrl train``: the plan does not fit, its largest term and the fix."""
    big = plan.largest
    fix = plan.knobs[0].change if plan.knobs else "a device with more memory"
    fitting = next((kb.change for kb in plan.knobs if kb.fits), None)
    fix = fitting or fix
    return (
        f"the memory plan does not fit: about {gib(plan.total)} GiB per device against {gib(plan.device_memory)} GiB "
        f"(an estimate; largest term {big} {gib(plan.terms[big])} GiB): try {fix} "
        "(`mmrl estimate CONFIG` shows the plan; run.gpu_memory=off skips this check)"
    )
