#!/usr/bin/env bash
# Falcon's GPU acceptance kit: one command on a machine with an NVIDIA GPU and PyTorch (no
# network, nothing to install) that checks the shim over the real NCCL, its GPU timings, the
# live agent + controller on a real job with a slow rank, a mismatch and a stuck rank diagnosed,
# and the shim's overhead, and prints one report. With --emulated it runs the same steps over Falcon's NCCL and CUDA emulators (CI).
#
#   scripts/gpu_check.sh [--bundle DIR] [--out DIR] [--json FILE] [--steps env,calls,...] [...]
#
# From a bundle (scripts/bundle.sh): copy falcon-bundle/ to the GPU machine and run
#   falcon-bundle/scripts/gpu_check.sh --out /tmp/falcon-check
# From a checkout with a build tree: scripts/gpu_check.sh --build build
# Every option: scripts/gpu_check.sh --help. Exit status 0 when every step passed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
args=("$@")
has_source=0
for a in "$@"; do
  case "$a" in --bundle|--build|--bundle=*|--build=*) has_source=1 ;; esac
done
if ((has_source == 0)); then
  if [[ -x $root/bin/falcon-agent ]]; then
    args=(--bundle "$root" "${args[@]}")          # run from inside a bundle
  elif [[ -d $root/falcon-bundle/bin ]]; then
    args=(--bundle "$root/falcon-bundle" "${args[@]}")
  else
    args=(--build "$root/build" "${args[@]}")
  fi
fi
py=${PYTHON:-python3}
exec "$py" "$here/gpu_kit/gpu_check.py" "${args[@]}"
