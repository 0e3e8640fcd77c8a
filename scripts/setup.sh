#!/usr/bin/env bash
# Create .venv (if missing) and install mmrl with the given extras on a CPU torch.
# Usage: bash scripts/setup.sh [extra,extra...]     e.g. bash scripts/setup.sh dev
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
PIP=".venv/bin/python -m pip"
export DS_BUILD_OPS=0  # DeepSpeed: no op pre-build at install (its CPU comm op compiles at first use)
# torch first, pinned: a bare `torch` requirement would pull several GB of CUDA packages on CPU.
$PIP install -q --disable-pip-version-check -c .ci/constraints.txt torch
spec="."
[ -n "$extras" ] && spec=".[$extras]"
$PIP install -q --disable-pip-version-check -c .ci/constraints.txt -e "$spec"
