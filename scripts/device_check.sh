#!/usr/bin/env bash
# The device check (issue 30) on the GPU machine: installs what travels, then runs
# scripts/device_check.py, which writes device_check.json and device_check.log under $OUT.
#
#   MMRL_COMMIT=<git rev-parse HEAD here> bash scripts/device_check.sh [device_check.py flags]
#
# The GPU machine (the lent GPU machine, as measured there) has Python 3.12 with CUDA torch 2.11, transformers
# 5.17, tokenizers, peft, accelerate, safetensors, pillow, pyyaml, tqdm, numpy, imageio and
# tensorboard, and no network: nothing is downloaded there.
#
# - What it lacks and a step needs travels as wheels in .whl/ (ignored by git; name it in the run
#   tool's `carry`). Today one: diffusers (the `diffusers` step: tiny SD3 and FLUX pipelines), which
#   needs only what is there (huggingface-hub >= 1.32, safetensors >= 0.8, pillow, regex, requests).
#   Made here, once, from the repository root:
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_17_x86_64 -d .whl diffusers==0.42.1
#   Without it that step is skipped, saying so. The `metaworld` step needs metaworld, mujoco,
#   gymnasium and their small dependencies (about 45 MB of wheels, metaworld's MuJoCo assets most of
#   it), made the same way into .whl/:
#     metaworld==3.1.1 mujoco==3.3.0 gymnasium==1.2.2 farama-notifications cloudpickle absl-py etils pyopengl
#     (and glfw with --platform manylinux_2_28_x86_64)
#   and scipy, whose wheel (35 MB) would take the carry past its 64 MiB: where the GPU machine has no
#   scipy, that step is skipped, naming it. It renders through the GPU's EGL (MUJOCO_GL=egl).
#   LeRobot (the `lerobot` step) needs too many
#   packages to travel (av, draccus, datasets, ...): that step is skipped there.
# - mmrl itself: `pip install --no-deps --no-build-isolation --no-index -e .` from the working tree
#   that travelled (setuptools is there; no build isolation, which would fetch it). If that fails,
#   the checkout runs from PYTHONPATH, as the tests do.
# - The git folder does not travel: pass the commit as MMRL_COMMIT (else the JSON says unknown).
#
# The whole check stays under 8 minutes (device_check.py's --budget of 450 s for its steps; the
# `timeout` below is the backstop). Exit status 1 when a step failed; the JSON says which and why.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
t0=$(date +%s)

if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} \
        || echo "device_check.sh: the wheels in .whl/ did not install; the steps that need them are skipped"
fi
if ! "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e .; then
    echo "device_check.sh: pip install -e . failed; running mmrl from the checkout (PYTHONPATH)"
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
echo "device_check.sh: installed in $(($(date +%s) - t0)) s"

timeout --kill-after=10 480 "$PY" scripts/device_check.py --out "${OUT:-device_check_out}" "$@"
