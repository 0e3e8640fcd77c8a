"""What the diffusers generators (`mmrl.policies.sd3`, `mmrl.policies.flux`) share.

`DiffusersGenerator` wraps a diffusers text-to-image pipeline whose denoiser is a transformer:
loading (``from_pretrained`` of the subclass's ``pipeline_class``, a local folder saved with
null components such as no T5 included), freezing every other pipeline module (VAE, text
encoders), the fine-tuning mode (``"lora"``: a peft adapter of rank ``lora_rank`` on the
attention projections ``LORA_TARGETS`` and the reference is the same transformer with the
adapter switched off (`disable_adapter`); ``"full"``: every transformer weight trains), the
memory-saving modes diffusers' training scripts use (the pipeline loaded in a half ``dtype`` with the
trained weights kept in float32, gradient checkpointing of the transformer's blocks), device
moves, and the VAE side (`decode` to ``[-1, 1]`` and `encode_images`, both with the VAE's
``scaling_factor`` / ``shift_factor``). Samples live in the unpacked VAE latent space
``[C, H/f, W/f]``.

Precision: `from_pretrained` loads every component in ``dtype`` (the policy's ``policy.dtype``: VAE,
text encoders, the transformer's frozen weights); the weights that train stay float32, as diffusers'
LoRA scripts do (``cast_training_params``: peft creates the adapters in the base layer's dtype, so they
are cast back; peft runs them on float32 inputs and casts their output to the base layer's), and a full
fine-tune's transformer is float32 (what the torch and FSDP2 engines expect: fp32 weights, bf16 by
autocast or ``MixedPrecisionPolicy``; DeepSpeed keeps its own fp32 master copy). `forward` casts its
inputs to the transformer's dtype and its output back to the input's (the samplers' float32), so the
chain and the log-probs stay float32 (`mmrl.flow.steps.transition` computes in at least float32).

`export_pretrained` writes what diffusers users load (`mmrl export`): the whole pipeline folder
(``save_pretrained``, with a LoRA fused into the transformer; ``<PipelineClass>.from_pretrained(DIR)``)
or, for a LoRA with ``merge=False``, the adapter alone as diffusers' LoRA training scripts save it
(``pytorch_lora_weights.safetensors``; ``pipe.load_lora_weights(DIR)`` on the base pipeline).

A subclass sets ``pipeline_class`` and ``latent_patch`` (the latent side must be a multiple of it) and
implements ``encode(prompts) -> cond`` and ``forward(x, t, cond) -> v`` (`_per_sample` repeats a
prompt's conditioning over the rows the samplers batch); a pipeline whose VAE or attention modules
are laid out otherwise (Wan's video VAE) overrides `latent_geometry` and `lora_targets`.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import torch
from torch import nn

from mmrl.policies.generator import TextToImageGenerator
from mmrl.utils.compat import patch_torchvision

#: the attention projections given LoRA: image and text streams of the joint (MMDiT) blocks, and
#: the single-stream blocks' projections where they exist (FLUX's, which have no ``to_out``)
LORA_TARGETS = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
]


class DiffusersGenerator(TextToImageGenerator):
    """Base of the diffusers generators (see the module docstring)."""

    pipeline_class: str = ""  # the diffusers pipeline class `from_pretrained` loads

    def __init__(
        self,
        pipe,
        image_size: int,
        finetune: str = "lora",
        lora_rank: int = 32,
        lora_alpha: int = 64,
        max_sequence_length: int = 128,
        gradient_checkpointing: bool = False,
    ):
        super().__init__()
        factor, channels = self.latent_geometry(pipe)
        step = factor * self.latent_patch(pipe)
        if image_size % step:
            raise ValueError(f"image_size {image_size} must be a multiple of {step} for this pipeline")
        self.pipe = pipe  # not a submodule: the text encoders and the VAE stay out of the state dict
        self.transformer = pipe.transformer
        for m in self._frozen():
            m.requires_grad_(False)
        self.finetune = finetune
        if finetune == "lora":
            from peft import LoraConfig

            self.transformer.requires_grad_(False)
            self.transformer.add_adapter(
                LoraConfig(
                    r=lora_rank,
                    lora_alpha=lora_alpha,
                    init_lora_weights="gaussian",
                    target_modules=self.lora_targets(self.transformer),
                )
            )
            for p in self.transformer.parameters():  # peft made them in the base weights' dtype
                if p.requires_grad:
                    p.data = p.data.float()
        elif finetune == "full":
            self.transformer.requires_grad_(True).float()  # trained weights in float32 (the module docstring)
        else:
            raise ValueError(f"finetune must be 'lora' or 'full', got {finetune!r}")
        if gradient_checkpointing:  # diffusers' own: each block recomputed in the backward (use_reentrant=False)
            self.transformer.enable_gradient_checkpointing()
        self.vae_scale_factor = factor
        self.latent_channels = channels
        self.latent_size = image_size // factor
        self.max_sequence_length = max_sequence_length
        self.has_adapter = finetune == "lora"  # else the policy keeps a frozen copy as its reference

    @staticmethod
    def latent_patch(pipe) -> int:
        """The latent side must be a multiple of this (the transformer's patch size)."""
        return pipe.transformer.config.patch_size

    @staticmethod
    def latent_geometry(pipe) -> tuple[int, int]:
        """``(spatial downsampling factor, latent channels)`` of the pipeline's VAE (an image
        ``AutoencoderKL``: one halving per level after the first)."""
        return 2 ** (len(pipe.vae.config.block_out_channels) - 1), pipe.vae.config.latent_channels

    @staticmethod
    def lora_targets(transformer: nn.Module) -> list[str]:
        """The module names (as peft matches them, by suffix) given LoRA: `LORA_TARGETS` within a block."""
        return sorted(
            {
                name.split("transformer_blocks.")[-1].split(".", 1)[-1]
                for name, _ in transformer.named_modules()
                if any(name.endswith(t) for t in LORA_TARGETS)
            }
        )

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, image_size: int = 512, dtype: torch.dtype | None = None, **kwargs
    ) -> DiffusersGenerator:
        patch_torchvision()
        try:
            import diffusers
        except ImportError as exc:
            raise ImportError(f"the {cls.__name__} needs diffusers: pip install 'mmrl[diffusion]'") from exc
        index = Path(name_or_path) / "model_index.json"
        absent = {}  # components a local folder saved as null (e.g. no T5) must be passed as None
        if index.exists():
            absent = {
                k: None for k, v in json.loads(index.read_text()).items() if isinstance(v, list) and v == [None, None]
            }
        pipe = getattr(diffusers, cls.pipeline_class).from_pretrained(name_or_path, torch_dtype=dtype, **absent)
        return cls(pipe, image_size, **kwargs)

    def _frozen(self) -> list[nn.Module]:
        """The pipeline's modules other than the transformer (VAE, text encoders)."""
        return [m for m in self.pipe.components.values() if isinstance(m, nn.Module) and m is not self.transformer]

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return (self.latent_channels, self.latent_size, self.latent_size)

    def _apply(self, fn, *args, **kwargs):  # .to(device) moves the frozen pipeline parts too
        for m in self._frozen():
            m._apply(fn, *args, **kwargs)
        return super()._apply(fn, *args, **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    @staticmethod
    def _per_sample(cond: tuple[torch.Tensor, ...], n: int) -> tuple[torch.Tensor, ...]:
        """Repeat per-prompt conditioning to ``n`` rows (the samplers batch several x per prompt)."""
        reps = n // cond[0].shape[0]
        return tuple(c.repeat_interleave(reps, 0) for c in cond) if reps > 1 else tuple(cond)

    @contextlib.contextmanager
    def disable_adapter(self):
        self.transformer.disable_adapters()
        try:
            yield
        finally:
            self.transformer.enable_adapters()

    def export_pretrained(self, folder, merge: bool = True) -> str:
        """Write the generator in diffusers' formats; returns the format's name.

        - ``merge=True``, or a full fine-tune: the pipeline folder (``save_pretrained``: transformer,
          VAE, text encoders, tokenizers, scheduler), a LoRA fused into a copy of the transformer;
          ``<PipelineClass>.from_pretrained(folder)`` loads it (a pipeline saved without T5 needs
          ``text_encoder_3=None, tokenizer_3=None`` there, as diffusers always asks).
        - a LoRA with ``merge=False``: ``pytorch_lora_weights.safetensors`` as diffusers' LoRA training
          scripts write it (peft's ``get_peft_model_state_dict``, which drops the adapter name, then
          the pipeline class's ``save_lora_weights``, which prefixes ``transformer.``), with the
          adapter's peft config as metadata so ``lora_alpha / r`` is kept;
          ``pipe.load_lora_weights(folder)`` loads it onto the base pipeline.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        pipe_class = type(self.pipe)
        if self.finetune == "lora" and not merge:
            from peft.utils import get_peft_model_state_dict

            layers = get_peft_model_state_dict(self.transformer)
            pipe_class.save_lora_weights(
                str(folder),
                transformer_lora_layers={k: v.detach().cpu().contiguous() for k, v in layers.items()},
                transformer_lora_adapter_metadata=self.transformer.peft_config["default"].to_dict(),
            )
            return "diffusers lora"
        transformer = self.transformer
        if self.finetune == "lora":  # fuse into a copy: the policy keeps its adapter
            transformer = copy.deepcopy(transformer)
            transformer.fuse_lora(lora_scale=1.0)
            transformer.unload_lora()
        pipe_class(**{**self.pipe.components, "transformer": transformer}).save_pretrained(str(folder))
        return "diffusers"

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        z = x0.to(vae.dtype) / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
        with torch.no_grad():
            return vae.decode(z, return_dict=False)[0].float().clamp(-1, 1)

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, H, W, 3] -> latents (the VAE posterior mean, scaled and shifted)."""
        vae = self.pipe.vae
        x = images.to(self.device).permute(0, 3, 1, 2).to(vae.dtype).div(127.5).sub(1.0)
        z = vae.encode(x).latent_dist.mean
        return ((z - (vae.config.shift_factor or 0.0)) * vae.config.scaling_factor).float()
