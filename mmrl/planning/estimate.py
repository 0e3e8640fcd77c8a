"""An experiment config -> its `Workload` (`mmrl.planning.memory`), before any work: parameter counts
from the real classes built on the meta device (`mmrl.planning.architectures`), shapes and batch sizes
from the config. `plan_experiment` prices it; `check_plan` is what ``mmrl train`` runs at load.

Per family:

* ``vlm`` / ``token_vla`` (transformers): the model from its published architecture; trainable per
  ``finetune`` (LoRA: the adapters of `mmrl.policies.vlm.lora_targets` at ``lora_rank``; full, minus
  a frozen vision tower). Training rows of ``max_prompt_tokens + max_new_tokens`` tokens (the
  configured maxima: an upper bound); the vision tower's activations only when it trains, at
  ``merge^2`` patches per prompt token (an upper bound: as if the whole prompt were image tokens).
  Rollout: the HF ``generate`` KV cache of ``sim.num_envs`` sequences (per rank), or vLLM's reserved
  share of the device.
* ``diffusion`` (diffusers): the transformer (and its buffers) and, outside the module, the text
  encoders and VAE, at ``policy.dtype`` (the trained weights, LoRA adapters or a full fine-tune's
  transformer, at float32; under DeepSpeed bf16 / fp16 everything at half with its fp32 master copy);
  training rows of ``minibatch / ranks`` samples times the times trained per sample (NFT / AWM
  timesteps, or the stochastic steps of Flow-GRPO) times 2 with classifier-free guidance, each of
  ``latent frames x (latent side / patch)^2`` image tokens, plus for SD3 / FLUX the text tokens their
  joint blocks carry (FLUX: double- and single-stream stacks), for Wan ``max_sequence_length`` text
  tokens of cross-attention context; ``policy.gradient_checkpointing`` (or the engine's) keeps one input
  per block. Rollout: the stored chain and one no-grad block. The VAE decode of a rollout is not counted.
* ``wan_world_model``: the same parts as ``diffusion`` on Wan, plus its action and state layers;
  rows of ``warm_start.batch_size`` (it is trained by its warm start alone), each the context frames'
  and the target frame's latent tokens; no rollout.
* the built-in policies (``flow_vla``, ``gaussian``, ``dsrl``, ``residual``, a ``tiny`` generator or
  VLM): the policy itself on meta (its simulator built with one env for its widths); small networks
  whose activations are not modelled.
* ``lerobot`` (and DSRL / residual over one): not covered yet (`NotPlanned`): sizing it would load its
  checkpoint; ``mmrl train`` skips the check for it.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace
from typing import Any

import torch

from mmrl.planning import architectures as A
from mmrl.planning.memory import DTYPE_BYTES, KVCache, Plan, Stack, Workload, make_plan
from mmrl.planning.memory import parse_bytes as parse_bytes
from mmrl.registry import SIMULATORS

#: an `mmrl.experiment.ExperimentConfig` (not imported: `mmrl.experiment` imports this module to check plans)
ExperimentConfig = Any

VLLM_DEFAULT_UTILIZATION = 0.9  # vLLM's own default gpu_memory_utilization


def _engine(cfg: ExperimentConfig, world: int, weight_bytes: int, trainable: int) -> dict[str, Any]:
    """The training engine's part of a workload (sharding, offload, the activation dtype)."""
    e = cfg.trainer.engine
    half = e.precision in ("bf16", "fp16")
    w_bytes = 2 if (e.backend == "deepspeed" and half and trainable) else weight_bytes
    return {
        "world": world,
        "backend": e.backend,
        "zero_stage": e.zero_stage,
        "offload_optimizer": e.offload_optimizer,
        "offload_params": e.offload_params,
        "weight_bytes": w_bytes,
        "act_bytes": 2 if (half or w_bytes == 2) else 4,
    }


def _rows(cfg: ExperimentConfig, world: int) -> int:
    return max(math.ceil(cfg.algorithm.minibatch_size / world), 1)


def _keys(cfg: ExperimentConfig, **more: str) -> dict[str, str]:
    return {"minibatch": "algorithm.minibatch_size", **more}


def _dtype_bytes(name: str, default: int = 4) -> int:
    return DTYPE_BYTES.get(name, 2 if name == "auto" else default)  # auto: published checkpoints are bf16


# ----------------------------------------------------------------------------------- transformers


def _config(module: torch.nn.Module) -> Any:
    """A transformers / diffusers model's config (attributes typed as Any)."""
    return module.config


def _text_config(model: torch.nn.Module) -> Any:
    config = _config(model)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _text_stack(model: torch.nn.Module, tokens: int, trains: bool = True) -> tuple[Stack, KVCache]:
    tc = _text_config(model)
    heads = tc.num_attention_heads
    kv = getattr(tc, "num_key_value_heads", None) or heads
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // heads
    stack = Stack("language model", tc.num_hidden_layers, tc.hidden_size, kv * head_dim, tc.intermediate_size, tokens)
    return dataclasses.replace(stack, trains=trains), KVCache(1, tokens, tc.num_hidden_layers, kv, head_dim)


def _vision_stack(model: torch.nn.Module, prompt_tokens: int, trains: bool) -> Stack | None:
    vc: Any = getattr(_config(model), "vision_config", None)
    if vc is None:
        return None
    merge: Any = getattr(vc, "spatial_merge_size", None) or getattr(_config(model), "scale_factor", 1)
    layers = getattr(vc, "depth", None) or vc.num_hidden_layers
    gated = getattr(vc, "hidden_act", "") == "silu"  # Qwen2.5-VL's gated vision MLP; SigLIP's is plain
    return Stack("vision tower", layers, vc.hidden_size, vc.hidden_size, vc.intermediate_size, prompt_tokens * merge**2,
                 gated=gated, trains=trains)  # fmt: skip


def _vision_trains(model: torch.nn.Module, trainable_names: set[str]) -> bool:
    from mmrl.policies.token_vla import VISION_TOWER_NAMES

    return any(any(part in VISION_TOWER_NAMES for part in n.split(".")) for n in trainable_names)


def _hf_model(name: str, tiny: dict | None) -> torch.nn.Module:
    if tiny is not None and name in tiny:  # built here: tiny, so built for real
        import importlib

        module, builder = tiny[name]
        return getattr(importlib.import_module(module), builder)(seed=0)[0]
    return A.meta_transformers(A.transformers_arch(name))


def vlm_workload(cfg: ExperimentConfig, world: int) -> Workload:
    from mmrl.policies.token_vla import freeze_vision_tower
    from mmrl.policies.vlm import TINY_MODELS, VLMConfig, lora_targets

    p = cfg.policy
    assert isinstance(p, VLMConfig), "workload() picks the family by policy.type"
    model = _hf_model(p.model, TINY_MODELS)
    if p.freeze_vision:
        freeze_vision_tower(model)
    params = A.count(model)
    lora = A.lora_count(model, lora_targets(model, p.lora_vision), p.lora_rank)
    if p.finetune == "lora":
        trainable, names = lora, {n for n in lora_targets(model, p.lora_vision)}
        params += lora
    else:
        trainable = A.count(model, trainable_only=True)
        names = {n for n, q in model.named_parameters() if q.requires_grad}
    tokens = p.max_prompt_tokens + p.max_new_tokens
    text, cache = _text_stack(model, tokens)
    vision = _vision_stack(model, p.max_prompt_tokens, _vision_trains(model, names))
    engine = _engine(cfg, world, _dtype_bytes(p.dtype), trainable)
    rollout_rows = cfg.sim.num_envs  # per rank (docs/guides/distributed.md)
    vllm = p.engine == "vllm"
    notes = ["sequence = max_prompt_tokens + max_new_tokens (the configured maxima, an upper bound)"]
    if vision is not None and vision.trains:
        notes.append("the vision tower trains: its activations assume the whole prompt is image tokens")
    return Workload(
        model=p.model,
        params=params,
        trainable=trainable,
        **engine,
        copies=params if p.reference == "copy" else 0,
        stacks=(text,) + ((vision,) if vision is not None else ()),
        train_rows=_rows(cfg, world),
        checkpointing=p.gradient_checkpointing or cfg.trainer.engine.gradient_checkpointing,
        logits=(p.max_new_tokens, _text_config(model).vocab_size),
        kv_cache=None if vllm else dataclasses.replace(cache, rows=rollout_rows),
        engine_fraction=float(p.engine_kwargs.get("gpu_memory_utilization", VLLM_DEFAULT_UTILIZATION))
        if vllm
        else None,
        minibatch=cfg.algorithm.minibatch_size,
        lora_trainable=lora if p.finetune == "full" else None,
        train_bytes=4 if p.finetune == "lora" else None,  # peft's adapters stay fp32 over a bf16 model
        notes=tuple(notes),
        keys=_keys(
            cfg,
            lora=f"policy.finetune=lora (rank {p.lora_rank})",
            checkpointing="policy.gradient_checkpointing",
            rollout_rows=f"sim.num_envs={max(cfg.sim.num_envs // 2, 1)} (half the rollouts in one generate)",
            engine_fraction="policy.engine_kwargs.gpu_memory_utilization",
        ),
    )


def token_vla_workload(cfg: ExperimentConfig, world: int, sim) -> Workload:
    from mmrl.policies.token_vla import TokenVLAConfig, freeze_vision_tower

    p = cfg.policy
    assert isinstance(p, TokenVLAConfig), "workload() picks the family by policy.type"
    model = _hf_model(p.model, None)
    if p.freeze_vision:
        freeze_vision_tower(model)
    vc = _config(model).vision_config
    merge = getattr(_config(model), "scale_factor", 1)
    views = len(cfg.sim.kwargs.get("camera_names", [0])) or 1
    image_tokens = views * (vc.image_size // vc.patch_size) ** 2 // merge**2
    action_tokens = p.chunk_size * sim.action_dim
    tokens = image_tokens + p.max_instruction_tokens + 32 + action_tokens  # 32: the chat template around them
    trainable = A.count(model, trainable_only=True)
    names = {n for n, q in model.named_parameters() if q.requires_grad}
    text, cache = _text_stack(model, tokens)
    vision = _vision_stack(model, image_tokens, _vision_trains(model, names))
    return Workload(
        model=p.model,
        params=A.count(model),
        trainable=trainable,
        **_engine(cfg, world, _dtype_bytes(p.dtype), trainable),
        stacks=(text,)
        + (
            (dataclasses.replace(vision, tokens=views * (vc.image_size // vc.patch_size) ** 2),)
            if vision is not None
            else ()
        ),  # fmt: skip
        train_rows=_rows(cfg, world),
        checkpointing=cfg.trainer.engine.gradient_checkpointing,
        logits=(action_tokens, _text_config(model).vocab_size),
        kv_cache=dataclasses.replace(cache, rows=cfg.sim.num_envs),  # per rank
        minibatch=cfg.algorithm.minibatch_size,
        notes=(
            f"one {vc.image_size} px tile per camera ({image_tokens} image tokens for {views} view(s)); "
            "the added action tokens and the value head are not counted",
        ),
        keys=_keys(cfg, checkpointing="trainer.engine.gradient_checkpointing"),
    )


# --------------------------------------------------------------------------------------- diffusers


def _pipeline_bytes(dtype: str, finetune: str, engine: dict, transformer) -> tuple[dict, str]:
    """A diffusers pipeline's byte widths for `Workload` (the frozen modules outside the trained one,
    the trained weights, the transformer's buffers) and how its precision reads in the notes. Loaded in
    half (``policy.dtype``), the frozen parts are half and the trained weights float32; DeepSpeed's half
    engine casts it all; the buffers (SD3's positional table) are in the transformer's dtype, float32
    for a full fine-tune."""
    half_engine = engine["backend"] == "deepspeed" and engine["weight_bytes"] == 2  # DeepSpeed casts it all
    half_load = dtype != "float32"
    if half_load and not half_engine:
        precision = f"pipeline in {dtype} (policy.dtype), the trained weights in float32"
    elif half_engine:
        precision = "DeepSpeed's half weights (fp32 master copy and moments)"
    else:
        precision = "weights fp32 as loaded (policy.dtype=bfloat16 halves the frozen ones)"
    widths = {
        "outside_bytes": 2 if (half_load or half_engine) else 4,
        "train_bytes": 4 if half_load and not half_engine else None,
        "buffer_bytes": A.count_buffers(transformer)
        * (4 if finetune == "full" and not half_engine else engine["weight_bytes"]),
    }
    return widths, precision


def diffusion_workload(cfg: ExperimentConfig, world: int) -> Workload:
    from mmrl.policies.diffusers_base import DiffusersGenerator
    from mmrl.policies.diffusion import DiffusionConfig, diffusers_family

    p = cfg.policy
    assert isinstance(p, DiffusionConfig), "workload() picks the family by policy.type"
    transformer, parts = A.diffusers_parts(p.model)
    family = diffusers_family(p.model)
    if family == "wan":
        from mmrl.policies.wan import WanGenerator, latent_frames

        gen_cls: type[DiffusersGenerator] = WanGenerator
    elif family == "flux":
        from mmrl.policies.flux import FluxGenerator

        gen_cls = FluxGenerator  # its 2x2 packing is the patch (the transformer's own patch_size is 1)
    else:
        gen_cls = DiffusersGenerator
    pipe = SimpleNamespace(transformer=transformer, **parts)
    factor, channels = gen_cls.latent_geometry(pipe)
    patch = gen_cls.latent_patch(pipe)
    frames = latent_frames(p.num_frames, _config(parts["vae"]).scale_factor_temporal) if family == "wan" else 1
    side = p.image_size // factor
    tokens = frames * (side // patch) ** 2
    lora = A.lora_count(transformer, gen_cls.lora_targets(transformer), p.lora_rank, suffix=True)
    base = A.count(transformer)
    trainable = lora if p.finetune == "lora" else base
    params = base + (lora if p.finetune == "lora" else 0)
    outside = sum(A.count(m) for m in parts.values())
    needs_ref = p.kl_reference or p.awm_ref_coef > 0 or p.nft_ref_coef > 0
    # a full fine-tune's reference copies the transformer (the text encoders and VAE are shared);
    # AWM's EMA and DiffusionNFT's old policy copy the trained weights
    copies = (params if needs_ref and p.finetune != "lora" else 0) + trainable * (
        (p.awm_ema_coef > 0) + (p.nft_old_decay is not None)
    )
    stacks, text = _diffusers_stacks(family, _config(transformer), tokens, p.max_sequence_length)
    cfg_rows = 2 if p.guidance_scale != 1.0 else 1
    engine = _engine(cfg, world, DTYPE_BYTES[p.dtype], trainable)
    widths, precision = _pipeline_bytes(p.dtype, p.finetune, engine, transformer)
    rollout_rows = cfg.sim.num_envs  # per rank (docs/guides/distributed.md)
    chain = rollout_rows * (p.num_steps + 1) * channels * frames * side * side * 4
    # a no-grad forward keeps little alive at once: the FFN's inner activation and a few hidden-size tensors
    widest = max(stacks, key=lambda st: st.tokens * (st.ffn + 4 * st.hidden))
    transient = rollout_rows * cfg_rows * widest.tokens * (widest.ffn + 4 * widest.hidden) * engine["act_bytes"]
    notes = [
        f"{tokens} latent tokens per sample ({frames} x {side // patch} x {side // patch})"
        + (f" + {text} text tokens through the joint blocks" if text else "")
        + f", {_times_per_sample(cfg) * cfg_rows} model rows per trained sample; {precision}",
        "the VAE decode of a rollout is not counted (policy.vae_slicing / vae_tiling lower it)",
    ]
    if getattr(_config(transformer), "dual_attention_layers", None):
        notes.append("SD3.5's second (image-only) attention in its dual-attention blocks is not counted")
    return Workload(
        model=p.model,
        params=params,
        trainable=trainable,
        **engine,
        outside=outside,
        copies=copies,
        **widths,
        stacks=stacks,
        train_rows=_rows(cfg, world),
        rows_factor=_times_per_sample(cfg) * cfg_rows,
        checkpointing=p.gradient_checkpointing or cfg.trainer.engine.gradient_checkpointing,
        rollout_bytes=chain + transient,
        minibatch=cfg.algorithm.minibatch_size,
        lora_trainable=lora if p.finetune == "full" else None,
        notes=tuple(notes),
        keys=_keys(
            cfg,
            lora=f"policy.finetune=lora (rank {p.lora_rank})",
            checkpointing="policy.gradient_checkpointing",
            half_weights="policy.dtype=bfloat16",
        ),
    )


def _diffusers_stacks(family: str, tc: Any, image_tokens: int, max_sequence_length: int | None):
    """The transformer's block stacks and the text tokens that run through them (0 for Wan, whose
    text is a cross-attention context). SD3's and FLUX's joint blocks carry the image and the text
    stream (each with its own MLP, in proportion to its tokens); FLUX adds its single-stream blocks over
    both. The text: SD3's 77 CLIP tokens then ``max_sequence_length`` T5 tokens, FLUX's T5 tokens (128
    by default, `DiffusersGenerator`'s), Wan's UMT5 context (512)."""
    hidden = tc.num_attention_heads * tc.attention_head_dim
    if family == "wan":
        context = max_sequence_length or 512
        wan = Stack(
            "transformer", tc.num_layers, hidden, hidden, tc.ffn_dim, image_tokens, gated=False, context=context
        )
        return (wan,), 0
    text = (max_sequence_length or 128) + (77 if family == "sd3" else 0)
    joint = Stack("joint blocks", tc.num_layers, hidden, hidden, 4 * hidden, image_tokens + text, gated=False)
    if family == "flux":
        single = Stack("single-stream blocks", tc.num_single_layers, hidden, hidden, 4 * hidden, image_tokens + text,
                       gated=False)  # fmt: skip
        return (joint, single), text
    return (joint,), text


def _times_per_sample(cfg: ExperimentConfig) -> int:
    """Model rows per trained sample in the update's one batched call."""
    from mmrl.policies.diffusion import DiffusionConfig

    p, objective = cfg.policy, cfg.algorithm.objective
    assert isinstance(p, DiffusionConfig)
    if objective == "nft":
        return p.nft_timesteps
    if objective == "awm":
        return p.awm_timesteps
    if p.stochastic == "one":
        return 1
    if p.stochastic == "window" and p.window:
        return p.window[1] - p.window[0]
    return max(round(p.num_steps * p.timestep_fraction), 1)


def wan_world_model_workload(cfg: ExperimentConfig, world: int) -> Workload:
    """The world model on Wan (`mmrl.policies.wan_world_model`): the transformer, its new action and
    state layers (built on meta) and, outside the module, UMT5 and the VAE; trained by its warm start
    alone, ``warm_start.batch_size`` rows of ``(context + 1) x (latent side / patch)^2`` tokens with
    the instruction's ``max_sequence_length`` UMT5 tokens and the action / state tokens as context."""
    from mmrl.errors import UserError
    from mmrl.policies.wan import WanGenerator
    from mmrl.policies.wan_world_model import WanWorldModelConfig, condition_heads

    p = cfg.policy
    assert isinstance(p, WanWorldModelConfig), "workload() picks the family by policy.type"
    if not p.pretrained:
        raise UserError("'policy.pretrained' is unset: name a diffusers WanPipeline (hub id or folder) to plan it")
    transformer, parts = A.diffusers_parts(p.pretrained, "policy.pretrained")
    tc = _config(transformer)
    factor, _ = WanGenerator.latent_geometry(SimpleNamespace(transformer=transformer, **parts))
    patch = tc.patch_size[1]
    static = vars(SIMULATORS.get(cfg.sim.type))
    dims = [static.get("action_dim"), static.get("state_dim"), p.image_size or cfg.sim.kwargs.get("image_size")]
    if not all(isinstance(d, int) for d in dims):  # the simulator's widths are not on its class: one env says
        sim = _one_env_sim(cfg)
        dims = [sim.action_dim, sim.state_dim or 0, p.image_size or sim.image_shape[0]]
        sim.close()
    action_dim, state_dim, image = (int(d) for d in dims)
    with torch.device("meta"):
        heads = A.count(condition_heads(tc.text_dim, p.chunk_size * action_dim, state_dim, p.cond_hidden))
    per_frame = (image // factor // patch) ** 2
    tokens = (p.context + 1) * per_frame
    lora = A.lora_count(transformer, WanGenerator.lora_targets(transformer), p.lora_rank, suffix=True)
    base = A.count(transformer)
    trainable = heads + (lora if p.finetune == "lora" else base)
    context = p.max_sequence_length + 1 + (1 if state_dim else 0)  # the instruction's, the action's, the state's
    stacks, _ = _diffusers_stacks("wan", tc, tokens, context)
    engine = _engine(cfg, world, DTYPE_BYTES[p.dtype], trainable)
    widths, _ = _pipeline_bytes(p.dtype, p.finetune, engine, transformer)
    rows = cfg.warm_start.batch_size
    return Workload(
        model=p.pretrained,
        params=base + heads + (lora if p.finetune == "lora" else 0),
        trainable=trainable,
        **engine,
        outside=sum(A.count(m) for m in parts.values()),
        **widths,
        stacks=stacks,
        train_rows=max(math.ceil(rows / world), 1),
        checkpointing=p.gradient_checkpointing or cfg.trainer.engine.gradient_checkpointing,
        minibatch=rows,
        lora_trainable=heads + lora if p.finetune == "full" else None,
        notes=(
            f"{tokens} latent tokens per row ({p.context} context + 1 target frame of {per_frame}) and {context} "
            "text tokens of cross-attention context; the warm start alone (no rollout)",
            "the VAE encode of each row's frames and the per-token time modulation are not counted",
        ),
        keys=_keys(
            cfg,
            minibatch="warm_start.batch_size",
            lora=f"policy.finetune=lora (rank {p.lora_rank})",
            checkpointing="policy.gradient_checkpointing",
            half_weights="policy.dtype=bfloat16",
        ),
    )


# ------------------------------------------------------------------------- flow VLA on a transformers VLM


class _PrefixStandIn(torch.nn.Module):
    """What `FlowVLAPolicy` reads of its backbone to size itself (no weights): the prefix width."""

    uses_images = True

    def __init__(self, out_dim: int):
        super().__init__()
        self.out_dim = out_dim


def hf_flow_vla_workload(cfg: ExperimentConfig, world: int, dims: tuple[int, int | None]) -> Workload:
    """The flow VLA on a transformers VLM prefix (``policy.backbone`` a hub id or folder): the VLM on
    meta from its config, the rest of the policy (expert, heads) built on meta around a stand-in of
    the prefix width. A frozen VLM is priced like a frozen encoder (no gradient, no activations kept:
    its forward runs under no_grad); the expert's activations are those of one forward per denoising
    step of each trained row, its self-attention over the chunk and cross-attention to the prefix."""
    from mmrl.policies.flow_vla import FlowVLAPolicy
    from mmrl.policies.processing import ActionNormalizer

    p = cfg.policy
    action_dim, state_dim = dims
    vlm = A.meta_transformers(A.transformers_arch(p.backbone, "policy.backbone"))
    width = _text_config(vlm).hidden_size
    normalizer = ActionNormalizer.from_config(p.action_low, p.action_high)  # it checks its bounds: not on meta
    with torch.device("meta"):
        rest = FlowVLAPolicy(p, action_dim, state_dim, backbone=_PrefixStandIn(width), normalizer=normalizer)
    vlm_params, rest_params = A.count(vlm), A.count(rest)
    vlm_bytes = _dtype_bytes(p.backbone_dtype)
    frozen = p.freeze_backbone
    trainable = rest_params + (0 if frozen else vlm_params)
    vc: Any = getattr(_config(vlm), "vision_config", None)
    views = p.num_views or len(cfg.sim.kwargs.get("camera_names", [0])) or 1
    merge: int = getattr(_config(vlm), "scale_factor", None) or getattr(vc, "spatial_merge_size", None) or 1
    image_tokens = views * (vc.image_size // vc.patch_size) ** 2 // merge**2 if vc is not None else 0
    prefix = image_tokens + 64 + 16 + 1  # instruction (at most 64 tokens), the chat template, the state token
    d = p.expert_dim
    expert = Stack("action expert", p.expert_layers, d, d, 2 * d, p.chunk_size, gated=False, context=prefix)
    text, _ = _text_stack(vlm, prefix, trains=not frozen)
    engine = _engine(cfg, world, 4, trainable)
    return Workload(
        model=f"flow_vla on {p.backbone}",
        params=rest_params + (0 if frozen else vlm_params),
        trainable=trainable,
        **{**engine, "weight_bytes": 4 if frozen else vlm_bytes},  # a trained VLM: its dtype (the expert is small)
        outside=vlm_params if frozen else 0,
        outside_bytes=vlm_bytes,
        stacks=(expert,) if frozen else (expert, text),
        train_rows=_rows(cfg, world),
        rows_factor=p.num_steps,
        checkpointing=cfg.trainer.engine.gradient_checkpointing,
        rollout_bytes=cfg.sim.num_envs * (p.num_steps + 1) * p.chunk_size * action_dim * 4,
        minibatch=cfg.algorithm.minibatch_size,
        notes=(
            f"prefix of {prefix} tokens per sample ({image_tokens} image tokens for {views} view(s), instruction "
            "and template at most 81); the expert runs once per denoising step of each trained row",
            "the frozen VLM (policy.freeze_backbone) is the 'frozen encoders' term"
            if frozen
            else "the VLM trains: its weights are priced in the policy's dtype",
        ),
        keys=_keys(cfg, checkpointing="trainer.engine.gradient_checkpointing"),
    )


# ---------------------------------------------------------------------------------------- built-in


def builtin_workload(cfg: ExperimentConfig, world: int, sim) -> Workload:
    """A policy built here (its own small networks): the real class, built (on the CPU: small) from the
    simulator's widths; activations not modelled."""
    from mmrl.registry import POLICIES

    cls = POLICIES.get(cfg.policy.type)
    configured = cls.configure(cfg.policy, sim)
    policy = cls(configured, action_dim=sim.action_dim, state_dim=sim.state_dim)
    trainable = A.count(policy, trainable_only=True)
    return Workload(
        model=f"{cfg.policy.type} (built-in)",
        params=A.count(policy),
        trainable=trainable,
        **_engine(cfg, world, 4, trainable),
        train_rows=_rows(cfg, world),
        minibatch=cfg.algorithm.minibatch_size,
        notes=("activations of built-in networks are not modelled (small networks; the batch decides)",),
        keys=_keys(cfg),
    )


def _one_env_sim(cfg: ExperimentConfig):
    """One env of the training simulator, for the widths a built-in policy is sized by: on the CPU and,
    where the simulator takes ``vectorization``, in this process (one env needs no worker processes)."""
    import inspect

    from mmrl.errors import UserError

    kwargs = dict(cfg.sim.kwargs)
    if "vectorization" in inspect.signature(SIMULATORS.get(cfg.sim.type)).parameters:
        kwargs["vectorization"] = "sync"
    try:
        return SIMULATORS.build(cfg.sim.type, num_envs=1, seed=cfg.run.seed, device="cpu", **kwargs)
    except Exception as exc:  # a simulator that does not start here (its assets, its renderer)
        raise UserError(
            f"the memory plan of policy '{cfg.policy.type}' reads its widths from simulator '{cfg.sim.type}', which "
            f"did not start here ({type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}): "
            "run it where the simulator runs"
        ) from exc


_BUILT_IN_BACKBONES = ("auto", "tiny", "state", "state_text")


class NotPlanned(ValueError):
    """A policy family the plan does not cover yet (`mmrl estimate` says so; `mmrl train` skips the check)."""


def _pretrained_lerobot(section: Any) -> bool:
    """A LeRobot policy (or a wrapper around one): building it would load its checkpoint."""
    return section is not None and (section.type == "lerobot" or _pretrained_lerobot(getattr(section, "base", None)))


def workload(cfg: ExperimentConfig, world: int = 1) -> Workload:
    """The `Workload` of an experiment on ``world`` training ranks (see the module docstring)."""
    kind = cfg.policy.type
    if _pretrained_lerobot(cfg.policy):
        raise NotPlanned(
            "the memory plan does not cover LeRobot policies yet (sizing one would load its checkpoint); "
            "docs/guides/memory.md lists what it covers"
        )
    if kind == "vlm":
        return vlm_workload(cfg, world)
    if kind == "diffusion" and getattr(cfg.policy, "model", "tiny") != "tiny":
        return diffusion_workload(cfg, world)
    if kind == "wan_world_model":
        return wan_world_model_workload(cfg, world)
    sim_cls = SIMULATORS.get(cfg.sim.type)
    static = isinstance(vars(sim_cls).get("action_dim"), int)  # its widths, without building a simulator
    if kind == "token_vla" and static:
        return token_vla_workload(cfg, world, sim_cls)
    if kind == "flow_vla" and getattr(cfg.policy, "backbone", "auto") not in _BUILT_IN_BACKBONES:
        if static and "state_dim" in vars(sim_cls):  # both widths on the class (LIBERO: 7 and 8)
            return hf_flow_vla_workload(cfg, world, (sim_cls.action_dim, vars(sim_cls).get("state_dim")))
        sim = _one_env_sim(cfg)
        try:
            return hf_flow_vla_workload(cfg, world, (sim.action_dim, sim.state_dim))
        finally:
            sim.close()
    sim = _one_env_sim(cfg)
    try:
        if kind == "token_vla":
            return token_vla_workload(cfg, world, sim)
        return builtin_workload(cfg, world, sim)
    finally:
        sim.close()


def plan_experiment(cfg: ExperimentConfig, device_memory: int, world: int | None = None) -> Plan:
    """The memory plan of ``cfg`` per device of ``device_memory`` bytes (``world``: the training ranks,
    default ``placement.train_ranks``)."""
    return make_plan(workload(cfg, world or cfg.placement.train_ranks), device_memory)


def device_memory_of(cfg: ExperimentConfig) -> int | None:
    """The memory per device a run's plan is checked against: ``run.gpu_memory`` when it is a size, a
    CUDA run's own GPU when it is null, None (no check) for ``off`` or a CPU / MPS run without one."""
    budget = cfg.run.gpu_memory
    if budget is False or budget == "off":  # YAML reads a bare off as false
        return None
    if isinstance(budget, str):
        return parse_bytes(budget)
    if cfg.run.device.startswith("cuda") and torch.cuda.is_available():
        index = int(cfg.run.device.split(":")[1]) if ":" in cfg.run.device else 0
        if index < torch.cuda.device_count():
            return int(torch.cuda.get_device_properties(index).total_memory)
    return None


def check_plan(cfg: ExperimentConfig, world: int) -> Plan | None:
    """What ``mmrl train`` runs at load, before any work: the plan on ``world`` ranks against
    `device_memory_of`; a `UserError` in one line (the largest term and the fix) when it cannot fit.
    None when there is nothing to check against (a CPU run without ``run.gpu_memory``)."""
    from mmrl.errors import UserError
    from mmrl.planning.memory import refusal

    memory = device_memory_of(cfg)
    if memory is None:
        return None
    try:
        plan = plan_experiment(cfg, memory, world)
    except NotPlanned:  # a family the plan does not cover: nothing to refuse on
        return None
    if not plan.fits:
        raise UserError(refusal(plan))
    return plan
