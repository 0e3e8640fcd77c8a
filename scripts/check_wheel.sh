#!/usr/bin/env bash
# Build mmrl's wheel, install it (not editable) with the pinned CPU torch into a clean virtual
# environment and, from a folder outside the source tree, list the components, write the quickstart
# config (mmrl init) and train it briefly: the installed package alone must find its simulators,
# rewards, dataset recipes and example configs.
# Usage: bash scripts/check_wheel.sh          (PYTHON=python3.11 by default; pip's cache is reused)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
PY=${PYTHON:-python3.11}
BUILD_PY=.venv/bin/python
[ -x "$BUILD_PY" ] || BUILD_PY=$PY
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mmrl-wheel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
t0=$SECONDS
PIP_FLAGS=(-q --disable-pip-version-check)
INSTALL_FLAGS=(--no-compile)  # no .pyc for all of torch: imports compile what they use

# 1. the wheel, built from a copy of the files git would commit (tracked and untracked, not ignored),
#    so that no stale build/ folder or local leftover can slip into it
mkdir "$tmp/src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
    | tar --null -T - -cf - | tar -xf - -C "$tmp/src"
else
  tar --exclude='./.venv*' --exclude=./build --exclude=./runs --exclude='*.egg-info' --exclude=__pycache__ \
    -cf - . | tar -xf - -C "$tmp/src"
fi
"$BUILD_PY" -m pip wheel "${PIP_FLAGS[@]}" --no-deps "$tmp/src" -w "$tmp/dist"
wheel=$(ls "$tmp"/dist/mmrl-*.whl)
echo "built $(basename "$wheel") ($((SECONDS - t0)) s)"

# 2. its contents: every package and every recipe file, as mmrl_datasets; never a top-level datasets
"$BUILD_PY" - "$wheel" "$repo" <<'EOF'
import sys, zipfile
from pathlib import Path
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
repo = Path(sys.argv[2])
want = [p.relative_to(repo).as_posix() for top in ("mmrl",)
        for p in (repo / top).rglob("*.py") if "__pycache__" not in p.parts]
want += ["mmrl_datasets/" + p.relative_to(repo / "datasets").as_posix() for p in (repo / "datasets").glob("*/*")
         if p.is_file() and p.suffix != ".pyc"]
want += ["mmrl_configs/" + p.name for p in (repo / "configs").glob("*.yaml")]
for top in ("simulators", "rewards"):  # the adapters, under names that belong to mmrl
    want += [f"mmrl_{top}/" + p.relative_to(repo / top).as_posix() for p in (repo / top).rglob("*.py")
             if "__pycache__" not in p.parts]
missing = sorted(set(want) - names)
bad = sorted(n for n in names if n.split("/")[0] in ("datasets", "simulators", "rewards")
             or n.startswith("mmrl_datasets/__init__"))
if missing or bad:
    sys.exit(f"wheel is wrong: missing {missing[:10]}{' ...' if len(missing) > 10 else ''}; must not hold {bad}")
print(f"wheel holds {len(want)} source and recipe files, as expected")
EOF

# 3. a clean environment: torch first, pinned (as scripts/setup.sh does), then the wheel (not editable)
"$PY" -m venv "$tmp/venv"
V="$tmp/venv/bin/python"
"$V" -m pip install "${PIP_FLAGS[@]}" "${INSTALL_FLAGS[@]}" -c .ci/constraints.txt torch
"$V" -m pip install "${PIP_FLAGS[@]}" "${INSTALL_FLAGS[@]}" -c .ci/constraints.txt "$wheel"
echo "installed into a clean venv ($((SECONDS - t0)) s)"

# 4. from outside the source tree: nothing may come from the checkout
mkdir "$tmp/run"
cd "$tmp/run"
unset PYTHONPATH
"$V" - <<'EOF'
import importlib.util, sysconfig
from pathlib import Path
import mmrl, mmrl.data
site = Path(sysconfig.get_paths()["purelib"])
assert Path(mmrl.__file__).is_relative_to(site), f"mmrl imported from {mmrl.__file__}, not the wheel in {site}"
assert mmrl.data.DATASETS_DIR == site / "mmrl_datasets", mmrl.data.DATASETS_DIR
for name in ("datasets", "simulators", "rewards"):  # names other projects use: never taken by mmrl
    assert importlib.util.find_spec(name) is None, f"the wheel must not install a top-level `{name}`"
print(f"mmrl from {Path(mmrl.__file__).parent}, recipes from {mmrl.data.DATASETS_DIR}")
EOF
"$V" -m mmrl list > list.txt
for want in "reach_demos" "reach " "objectives" "flow samplers"; do
  grep -q "$want" list.txt || { cat list.txt; echo "mmrl list lacks '$want'" >&2; exit 1; }
done
"$tmp/venv/bin/mmrl" list >/dev/null  # the console script too
"$tmp/venv/bin/mmrl" init quickstart  # a pip user's config: the example the wheel ships
[ -f quickstart.yaml ] || { echo "mmrl init quickstart wrote no quickstart.yaml" >&2; exit 1; }
"$V" -m mmrl train quickstart.yaml run.threads=1 trainer.iterations=2 warm_start.steps=5 \
  warm_start.num_episodes=8 warm_start.batch_size=8 sim.num_envs=8 sim.eval_num_envs=8 \
  trainer.eval_episodes=8 trainer.video_episodes=0 algorithm.minibatch_size=16 > train.log 2>&1 \
  || { tail -30 train.log; echo "training from the wheel failed" >&2; exit 1; }
ls runs/quickstart/checkpoints/*/state.pt >/dev/null 2>&1 \
  || { tail -30 train.log; echo "no checkpoint in runs/quickstart/checkpoints" >&2; exit 1; }
tail -1 train.log
echo "check_wheel: ok ($((SECONDS - t0)) s): the wheel installs, lists its components and trains the quickstart"
