"""Random-weight diffusers pipeline folders at a published architecture's real size, written offline.

`write_random_pipeline` builds each component of a published `mmrl.planning.architectures.Arch`
(``ARCHITECTURES``: SD3.5-medium, FLUX.1-dev, Wan 2.1 T2V 1.3B, Wan 2.2 TI2V 5B; or an `Arch` given
directly) with the real classes at the architecture's sizes and random weights, and writes the standard
pipeline folder ``<Pipeline>.from_pretrained(folder)`` loads, so ``policy.model: <folder>`` runs the
diffusion policy's own loading code on a model of the real size (memory, speed) without downloading
the checkpoint:

- the transformer, the text encoders and the VAE, each built directly in ``dtype`` (torch's default
  dtype while it is constructed, so no float32 copy is ever made) with the classes' own initialisation,
  saved (safetensors), then freed before the next is built: the peak memory is the largest component
  (FLUX.1-dev's transformer: about 24 GB in bf16, T5-XXL's encoder about 9.5 GB);
- the tokenizers of `mmrl.tiny.tiny_diffusers` (CLIP's over byte symbols, T5's over printable
  characters): their token ids are far below the real vocabularies, which the embeddings still cover,
  so prompts encode (the text is not tokenized as the real tokenizers would);
- the scheduler the real pipeline ships (``Arch.scheduler``) and ``model_index.json`` with the pipeline's
  own config (``Arch.pipeline_config``, e.g. Wan 2.2's ``expand_timesteps``); components the pipeline
  allows but the architecture has none of (FLUX's image encoder, Wan 2.2 A14B's second transformer) are
  written as absent, as ``save_pretrained`` writes them.

Random weights generate noise, not images: the folders are for memory and throughput checks
(``mmrl estimate`` against a measured peak, a training step on a GPU), never for quality.

    python -m mmrl.planning.random_pipelines stabilityai/stable-diffusion-3.5-medium /data/sd35_random
    python -m mmrl.planning.random_pipelines black-forest-labs/FLUX.1-dev /data/flux_random --dtype bfloat16
    mmrl estimate configs/flux1_dev_nft.yaml policy.model=/data/flux_random
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mmrl.planning.architectures import ARCHITECTURES, Arch
from mmrl.utils.compat import patch_torchvision

#: the dtypes a folder can be written in (``--dtype``)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """torch's default dtype set to ``dtype`` inside (restored after): parameters are created in it."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_component(arch: Arch, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """The model of ``arch`` on the CPU with its class's random initialisation, in ``dtype`` (buffers too)."""
    patch_torchvision()
    with default_dtype(dtype):
        if arch.library == "transformers":
            import transformers

            if arch.config_cls is None:
                raise ValueError(f"{arch.cls}: a transformers Arch needs its config class (config_cls)")
            config = getattr(transformers, arch.config_cls)(**arch.fields)
            model = getattr(transformers, arch.cls)(config)
        else:
            import diffusers

            model = getattr(diffusers, arch.cls)(**arch.fields)
    return model.to(dtype).eval()


def _tokenizer(encoder: Arch, folder: Path):
    """The tiny tokenizer for a text encoder class (CLIP's or T5's), saved in ``folder``."""
    from mmrl.tiny.tiny_diffusers import tiny_clip_tokenizer, tiny_t5_tokenizer

    if encoder.cls.startswith("CLIP"):
        return tiny_clip_tokenizer(folder)
    if "T5" in encoder.cls:  # T5EncoderModel, UMT5EncoderModel
        return tiny_t5_tokenizer(folder)
    raise ValueError(f"no tiny tokenizer for a {encoder.cls} text encoder")


def _arch(hub_id_or_arch: str | Arch) -> Arch:
    arch = ARCHITECTURES.get(hub_id_or_arch) if isinstance(hub_id_or_arch, str) else hub_id_or_arch
    if arch is None:
        known = [k for k, a in ARCHITECTURES.items() if a.pipeline]
        raise ValueError(f"{hub_id_or_arch!r} is not a published pipeline mmrl knows: one of {', '.join(known)}")
    if arch.library != "diffusers" or arch.pipeline is None or arch.scheduler is None:
        raise ValueError(f"{arch.cls} is not a diffusers pipeline's transformer with its pipeline and scheduler")
    return arch


def write_random_pipeline(
    hub_id_or_arch: str | Arch, folder: str | Path, dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> Path:
    """Write a random-weight pipeline folder of ``hub_id_or_arch`` (a hub id of `ARCHITECTURES` or an
    `Arch`) in ``folder``, every weight in ``dtype``; returns the folder (see the module docstring)."""
    patch_torchvision()
    import diffusers

    arch = _arch(hub_id_or_arch)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    index: dict = {"_class_name": arch.pipeline, "_diffusers_version": diffusers.__version__}
    for i, (name, part) in enumerate((("transformer", arch), *arch.parts)):
        torch.manual_seed(seed + i)
        model: Any = build_component(part, dtype)  # a diffusers ModelMixin or a transformers PreTrainedModel
        model.save_pretrained(folder / name)
        index[name] = [part.library, part.cls]
        del model
        gc.collect()  # freed before the next component is built: the peak is the largest one
    for name, part in arch.parts:
        if name.startswith("text_encoder"):
            tok_name = name.replace("text_encoder", "tokenizer")
            tok = _tokenizer(part, folder / tok_name)
            index[tok_name] = ["transformers", type(tok).__name__]
    sched_cls, sched_fields = arch.scheduler  # type: ignore[misc]  # _arch checked it is set
    getattr(diffusers, sched_cls)(**sched_fields).save_pretrained(folder / "scheduler")
    index["scheduler"] = ["diffusers", sched_cls]
    pipe_cls = getattr(diffusers, arch.pipeline)  # type: ignore[arg-type]  # _arch checked it is set
    expected, _ = pipe_cls._get_signature_keys(pipe_cls)
    for name in sorted(set(expected) - set(index)):  # components the pipeline allows, absent here
        index[name] = [None, None]
    index.update(arch.pipeline_config)
    (folder / "model_index.json").write_text(json.dumps(dict(sorted(index.items())), indent=2) + "\n")
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mmrl.planning.random_pipelines",
        description="Write a random-weight diffusers pipeline folder at a published architecture's real size "
        "(for memory and speed checks: it generates noise). Peak memory: its largest component.",
    )
    parser.add_argument("hub_id", help=f"one of: {', '.join(k for k, a in ARCHITECTURES.items() if a.pipeline)}")
    parser.add_argument("folder", help="where to write the pipeline folder (policy.model: FOLDER)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="the weights' dtype")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args(argv)
    try:
        folder = write_random_pipeline(args.hub_id, args.folder, DTYPES[args.dtype], args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    print(f"wrote {folder} ({size / 1024**3:.2f} GiB, {args.dtype}): policy.model={folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
