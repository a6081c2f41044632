#!/usr/bin/env bash
# Installs every system package Falcon's build, tests and demo need (Debian 12), idempotently,
# and checks that the CUDA toolkit's nccl.h is present (it is not a Debian package here).
#   scripts/setup.sh            install what is missing (needs root or sudo)
#   scripts/setup.sh --check    only report what is missing; exit 1 if anything is
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config python3 git
  libgtest-dev libgmock-dev libbenchmark-dev
  libhiredis-dev libboost-dev libboost-system-dev libspdlog-dev nlohmann-json3-dev libcli11-dev
  libgoogle-perftools-dev  # tcmalloc_minimal: falcon-controller's allocator (FALCON_CONTROLLER_MALLOC)
  redis-server binutils
  clang libclang-rt-dev
  patchelf            # scripts/bundle.sh: $ORIGIN RPATHs
  python3-torch       # the Python package's torch.distributed hook, tested with gloo (CPU)
  prometheus python3-yaml systemd  # tests/deploy_test.sh: promtool, a live scrape, systemd-analyze
  python3-matplotlib  # bench/sim/plot_scale.py: the cost-against-N plots (docs/scale.md)
)

check_only=0
[[ "${1:-}" == "--check" ]] && check_only=1

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  if ((check_only)); then
    echo "setup: missing packages: ${missing[*]}" >&2
    exit 1
  fi
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all ${#PACKAGES[@]} packages present"
fi

cuda_home="${CUDA_HOME:-/usr/local/cuda}"
if [[ ! -f "$cuda_home/include/nccl.h" || ! -f "$cuda_home/include/cuda_runtime.h" ]]; then
  cat >&2 <<MSG
setup: nccl.h / cuda_runtime.h not found under $cuda_home/include.
  Falcon compiles its NCCL shim and emulator against the CUDA toolkit's headers (no GPU needed).
  Install the CUDA toolkit and NCCL headers, or point CUDA_HOME at a toolkit that has them.
MSG
  exit 1
fi
ver=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{printf "%s%s", sep, $3; sep="."}' "$cuda_home/include/nccl.h")
echo "setup: CUDA headers in $cuda_home/include, nccl.h $ver"
