#!/usr/bin/env bash
# The demos' set-up: system packages (scripts/setup.sh, idempotent), the default preset configured
# (build/) and the given targets built with every core.
# Usage: scripts/build.sh TARGET...
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target "$@"
