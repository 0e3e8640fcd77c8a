#!/usr/bin/env bash
# Install the system libraries the simulator adapters (and DeepSpeed's CPU op build) need (run as
# root, or with sudo available).
#
# ManiSkill3 (SAPIEN) needs a Vulkan driver even for state observations. On a machine without a
# GPU that is Mesa's software driver (lavapipe). Debian 12's Mesa 22 is too old
# (`ErrorIncompatibleDriver`); Mesa 25 from Debian's `<codename>-backports` suite works. This script
#   1. skips at once when a new enough mesa-vulkan-drivers (>= 23) and the Vulkan loader are installed;
#   2. adds the backports suite to the machine's EXISTING Debian apt source (the mirror URL is read
#      from /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list at run time);
#   3. apt-get update && apt-get install -t <codename>-backports mesa-vulkan-drivers libvulkan1.
# Idempotent and non-interactive (DEBIAN_FRONTEND=noninteractive). Usage: bash scripts/install_sim_deps.sh
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

log() { echo "install_sim_deps: $*"; }

SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    log "needs root (or password-less sudo) to install system packages" >&2
    exit 1
  fi
fi

if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
  log "no apt/dpkg here; install a Vulkan driver (Mesa >= 23 lavapipe, or a GPU driver) and the Vulkan loader by hand" >&2
  exit 1
fi

# DeepSpeed (the `deepspeed` extra, installed with DS_BUILD_OPS=0) compiles its CPU communication op
# on first use: it needs a C++ compiler.
if ! command -v g++ >/dev/null 2>&1; then
  log "installing g++ (DeepSpeed builds its CPU communication op at first use)"
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends g++
fi

installed_version() {  # prints the installed version of a package, or nothing
  dpkg-query -W -f='${db:Status-Status} ${Version}\n' "$1" 2>/dev/null | awk '$1 == "installed" {print $2}'
}

mesa_ok() {
  local v
  v="$(installed_version mesa-vulkan-drivers)"
  [ -n "$v" ] && dpkg --compare-versions "$v" ge 23 && [ -n "$(installed_version libvulkan1)" ]
}

if mesa_ok; then
  log "mesa-vulkan-drivers $(installed_version mesa-vulkan-drivers) and libvulkan1 already installed; nothing to do"
  exit 0
fi

. /etc/os-release
codename="${VERSION_CODENAME:-}"
if [ "${ID:-}" != debian ] || [ -z "$codename" ]; then
  log "not Debian (${PRETTY_NAME:-unknown}); trying the distribution's mesa-vulkan-drivers as is"
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends mesa-vulkan-drivers libvulkan1
  exit 0
fi
suite="${codename}-backports"

# Is the backports suite already configured somewhere?
has_suite() {
  grep -RhsE "^[[:space:]]*(Suites:.*[[:space:]]|deb[[:space:]].*[[:space:]])${suite}([[:space:]]|$)" \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources >/dev/null 2>&1
}

if ! has_suite; then
  uri="" signed=""
  # deb822 sources: the stanza whose Suites holds the plain codename.
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    read -r uri signed < <(awk -v cn="$codename" '
      function flush() { if (ok && u != "" && !done) { print u, (s == "" ? "-" : s); done = 1 } ok = 0; u = ""; s = "" }
      /^[[:space:]]*$/ { flush(); next }
      /^[[:space:]]*#/ { next }
      /^URIs:/ { u = $2 }
      /^Signed-By:/ { s = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == cn) ok = 1 }
      END { flush() }' "$f") || true
    [ -n "$uri" ] && break
  done
  # one-line sources
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri="$(awk -v cn="$codename" '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i == cn) { u = $(i - 1); print u; exit } }' \
      /etc/apt/sources.list)"
    signed="-"
  fi
  if [ -z "$uri" ]; then
    log "could not find a Debian apt source for '${codename}' to derive the mirror from" >&2
    exit 1
  fi
  target=/etc/apt/sources.list.d/mmrl-${suite}.sources
  log "adding ${suite} from ${uri} to ${target}"
  {
    echo "Types: deb"
    echo "URIs: ${uri}"
    echo "Suites: ${suite}"
    echo "Components: main"
    [ "$signed" != "-" ] && [ -n "$signed" ] && echo "Signed-By: ${signed}"
  } | $SUDO tee "$target" >/dev/null
else
  log "${suite} already configured"
fi

$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends -t "$suite" mesa-vulkan-drivers libvulkan1
if mesa_ok; then
  log "installed mesa-vulkan-drivers $(installed_version mesa-vulkan-drivers)"
else
  log "mesa-vulkan-drivers $(installed_version mesa-vulkan-drivers) is still older than 23" >&2
  exit 1
fi
