"""`mmrl.utils.compat`'s torchvision fix for processes mmrl does not start itself.

vLLM starts its own processes (the model-inspection subprocess, the engine core, the workers) and
imports transformers there, which imports torchvision, before any mmrl code could call
`mmrl.utils.compat.patch_torchvision`. Where the only torchvision is a CUDA build on CPU torch (the
CPU vLLM venv, ``scripts/setup_vllm.sh``) that import dies, and with it Qwen2-VL's video processor,
which transformers builds with every Qwen2.5-VL processor.

`install` puts a finder first on ``sys.meta_path`` that acts once, when ``torchvision`` is first
imported: if torchvision's compiled ops do not load against this torch, it defines their schemas
(`mmrl.utils.compat.define_missing_torchvision_ops`) and lets the import go on. A torchvision whose
ops load is not touched. ``scripts/setup_vllm.sh`` installs it in that venv with a ``.pth`` line
(run at every interpreter start), so importing this module must stay cheap: no torch here.
"""

from __future__ import annotations

import importlib.abc
import sys


class TorchvisionHook(importlib.abc.MetaPathFinder):
    """Fixes torchvision's op schemas right before its first import, then leaves ``sys.meta_path``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision":
            uninstall()
            from mmrl.utils.compat import define_missing_torchvision_ops

            define_missing_torchvision_ops()
        return None  # the normal finders import torchvision


def install() -> None:
    """Put the hook first on ``sys.meta_path`` (once; a no-op when torchvision is imported already)."""
    if "torchvision" not in sys.modules and not any(isinstance(f, TorchvisionHook) for f in sys.meta_path):
        sys.meta_path.insert(0, TorchvisionHook())


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, TorchvisionHook)]


__all__ = ["TorchvisionHook", "install", "uninstall"]
