"""A state dict to and from ``safetensors``: what checkpoints and `mmrl export` write weights with.

safetensors refuses tensors that share memory and non-tensor entries; a policy's state dict has both
(tied embeddings: ``lm_head.weight`` *is* ``embed_tokens.weight``; a module's ``_extra_state``).
`save_weights` writes each storage once: an entry that is the very same view of a tensor already
written becomes an *alias* (recorded in the file's metadata, restored by `load_weights` as the same
tensor object, so tying survives a round trip), other views of shared memory are copied, and
non-tensor entries are returned to the caller (a checkpoint keeps them in its ``state.pt``). Nothing
is pickled: `load_weights` reads only tensors and text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

ALIASES = "mmrl.aliases"  # metadata key: {"alias": "name written"}
SPEC = "mmrl.policy_spec"  # metadata key: the policy's build spec (`mmrl.experiment.build_policy`)


def split_state_dict(state_dict: dict) -> tuple[dict[str, torch.Tensor], dict[str, str], dict[str, Any]]:
    """``(tensors, aliases, others)``: the tensors to write (contiguous, on the CPU, no two sharing
    memory), ``{alias: written name}`` for entries that are the same view of a tensor written, and
    the non-tensor entries."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    others: dict[str, Any] = {}
    views: dict[tuple, str] = {}  # (device, data pointer, shape, stride, dtype) -> name written
    storages: set[tuple] = set()  # (device, storage pointer) of the tensors written as they are
    for name, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            others[name] = value
            continue
        value = value.detach()
        view = (value.device, value.data_ptr(), tuple(value.shape), value.stride(), value.dtype)
        if value.numel() and view in views:
            aliases[name] = views[view]
            continue
        storage = (value.device, value.untyped_storage().data_ptr())
        whole = (
            value.is_contiguous()
            and value.storage_offset() == 0
            and value.untyped_storage().nbytes() == value.numel() * value.element_size()
        )
        out = value.cpu()
        if not whole or storage in storages:  # a partial view, or memory written already
            out = out.contiguous().clone()
        else:
            storages.add(storage)
        if value.numel():
            views[view] = name
        tensors[name] = out
    return tensors, aliases, others


def save_weights(state_dict: dict, path: str | Path, metadata: dict[str, str] | None = None) -> dict[str, Any]:
    """Write the tensors of ``state_dict`` to the safetensors file ``path`` (aliases in its metadata,
    with ``metadata``); returns the non-tensor entries, which are not written."""
    from safetensors.torch import save_file

    tensors, aliases, others = split_state_dict(state_dict)
    meta = {"format": "pt", "library": "mmrl", **(metadata or {})}
    if aliases:
        meta[ALIASES] = json.dumps(aliases)
    save_file(tensors, str(path), metadata=meta)
    return others


def read_metadata(path: str | Path) -> dict[str, str]:
    """The text metadata of a safetensors file (its header only is read)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def load_weights(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``(state dict, metadata)`` of a file `save_weights` wrote: aliases are the tensor they name."""
    from safetensors.torch import load_file

    meta = read_metadata(path)
    tensors = load_file(str(path), device="cpu")
    for alias, name in json.loads(meta.get(ALIASES, "{}")).items():
        tensors[alias] = tensors[name]
    return tensors, meta


# ---- weights that come from the policy's source (its pretrained files) ------------------------------
def fingerprint(t: torch.Tensor) -> list[float]:
    """``[numel, sum, sum of |x|, sum of x^2]`` in float64: what tells a tensor rebuilt from the
    policy's source apart from another one (a different base model, revision or seed)."""
    x = t.detach().double()
    return [float(t.numel()), x.sum().item(), x.abs().sum().item(), (x * x).sum().item()]


def same_fingerprint(a: list[float], b: list[float], rtol: float = 1e-9) -> bool:
    """Whether two fingerprints are of the same values (up to summation order: another device)."""
    if a[0] != b[0]:
        return False
    scale = max(a[2], b[2], 1e-30)
    return (
        abs(a[1] - b[1]) <= rtol * scale
        and abs(a[2] - b[2]) <= rtol * scale
        and abs(a[3] - b[3]) <= rtol * max(a[3], b[3], 1e-30)
    )
