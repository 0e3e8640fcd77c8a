"""Work-arounds for broken third-party installs, applied explicitly and idempotently.

`patch_torchvision` exists because the only torchvision wheel some machines can reach is a CUDA
build whose compiled ops (``torchvision._C``) do not load against a CPU build of torch. torchvision
then dies at import time with ``RuntimeError: operator torchvision::nms does not exist``: its
``_meta_registrations`` module registers fake (meta) kernels for ``torchvision::nms`` / ``qnms``
without first checking that the ops were defined. Because transformers, diffusers, timm and
open_clip import torchvision whenever it is installed, one broken wheel breaks all of them.

The fix: define the missing operator *schemas* with `torch.library` so the fake-kernel
registrations succeed. torchvision's compiled ops stay unusable (calling ``torchvision.ops.nms``
still fails), but everything pure-Python in it (transforms, image/video processors' helpers)
works. A torchvision that imports fine is never touched.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import re
import sys

import torch

logger = logging.getLogger(__name__)

#: schemas of ops that torchvision's ``_meta_registrations`` needs to exist (from torchvision csrc)
TORCHVISION_OP_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_MISSING_OP = re.compile(r"operator torchvision::(\w+) does not exist")
_LIBRARY: torch.library.Library | None = None  # must stay alive: a collected Library unregisters its ops
_DEFINED: set[str] = set()
_STATE: str | None = None  # "absent" | "ok" | "patched" | "failed", once decided


def _op_exists(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
        return True
    except RuntimeError:
        return False


def _define(name: str) -> None:
    global _LIBRARY
    if name in _DEFINED or _op_exists(name):
        return
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library("torchvision", "FRAGMENT")  # FRAGMENT: never claims the namespace
    _LIBRARY.define(TORCHVISION_OP_SCHEMAS[name])
    _DEFINED.add(name)


def define_missing_torchvision_ops() -> bool:
    """Before torchvision is first imported: if its compiled ops (``torchvision/_C*.so``) do not load
    against this torch, define the schemas its fake-kernel registrations need, so that the import
    succeeds (`mmrl.utils.torchvision_hook` calls this in processes mmrl does not start). Returns
    whether it defined them; a torchvision whose ops load, or none, is left alone."""
    import glob
    import os

    spec = importlib.util.find_spec("torchvision")  # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        return False
    libs = [p for d in spec.submodule_search_locations for p in sorted(glob.glob(os.path.join(d, "_C*.so")))]
    if libs:
        try:
            torch.ops.load_library(libs[0])  # what torchvision's import does first; loading twice is harmless
            return False
        except (OSError, RuntimeError):
            pass
    for name in TORCHVISION_OP_SCHEMAS:
        _define(name)
    return True


def _forget_torchvision() -> None:
    for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[mod]


def patch_torchvision() -> str:
    """Make ``import torchvision`` work when its compiled ops cannot load; safe to call many times.

    Returns what happened: ``"absent"`` (torchvision not installed: nothing to do), ``"ok"`` (it
    imports as is, or was already imported: untouched), ``"patched"`` (missing op schemas were
    defined and it now imports) or ``"failed"`` (it fails for another reason; the original error is
    logged and will surface again at the caller's own import).

    Call it before anything imports torchvision (mmrl does so before importing transformers).
    """
    global _STATE
    if _STATE is not None:
        return _STATE
    if "torchvision" in sys.modules:  # already imported (successfully): too late and not needed
        _STATE = "ok"
        return _STATE
    if importlib.util.find_spec("torchvision") is None:
        _STATE = "absent"
        return _STATE
    patched = False
    for _ in range(len(TORCHVISION_OP_SCHEMAS) + 1):
        try:
            importlib.import_module("torchvision")
        except RuntimeError as err:  # only the "operator ... does not exist" failure is ours to fix
            match = _MISSING_OP.search(str(err))
            _forget_torchvision()  # a failed import can leave half-initialised submodules behind
            if match is None or match.group(1) not in TORCHVISION_OP_SCHEMAS or match.group(1) in _DEFINED:
                logger.warning("torchvision is installed but cannot be imported: %s", err)
                _STATE = "failed"
                return _STATE
            _define(match.group(1))
            patched = True
        except Exception as err:  # any other breakage is reported, not hidden or fixed
            _forget_torchvision()
            logger.warning("torchvision is installed but cannot be imported: %s", err)
            _STATE = "failed"
            return _STATE
        else:
            _STATE = "patched" if patched else "ok"
            if patched:
                logger.info(
                    "torchvision imported after defining op schemas %s (its compiled ops stay "
                    "unavailable: CPU torch with a CUDA torchvision build)",
                    sorted(_DEFINED),
                )
            return _STATE
    _STATE = "failed"
    return _STATE


__all__ = ["define_missing_torchvision_ops", "patch_torchvision", "TORCHVISION_OP_SCHEMAS"]
