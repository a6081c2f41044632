#!/usr/bin/env bash
# Falcon demo: a 16-rank emulated training job (TP 2 x DP 4 x PP 2 on 8 emulated nodes + 1 spare)
# under the shim, with Redis, one falcon-agent per node and falcon-controller. A slow GPU, then a
# congested link, then both, are detected, localised and mitigated live; the report (JSON + SVG
# plot of iteration time per rank with faults, localisations and decisions) goes to
# falcon-demo-out/. Does all set-up itself (packages, build). Stops everything it started and
# removes its temporary files, also on Ctrl-C. About 7 minutes.
#   scripts/demo.sh [--mitigation act|advise|off] [--phase-s S] [--out DIR] [--keep] [--quiet] [--json]
#   (defaults: act, 90 s per fault phase, falcon-demo-out)
set -euo pipefail
cd "$(dirname "$0")/.."
for arg in "$@"; do
  case "$arg" in
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
  esac
done

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "set-up: system packages and build (first run takes a few minutes)"
bash scripts/build.sh falcon_shim falcon-ctl falcon-agent falcon-controller falcon_nccl_emu falcon_emu_run \
  falcon_train_emu

say "run: Redis, 8 agents, the controller and the 16-rank job (Ctrl-C stops everything)"
exec python3 scripts/demo.py --build build "$@"
