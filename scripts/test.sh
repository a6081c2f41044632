#!/usr/bin/env bash
# Builds Falcon and runs every test: the full suite on an optimised build, then the shim,
# emulator and analyzer suites again under AddressSanitizer+UBSan and ThreadSanitizer.
#   scripts/test.sh                 everything (what CI runs)
#   scripts/test.sh --no-sanitizers the main build and suite only
# Build trees: build/ (RelWithDebInfo), build-asan/, build-tsan/. Uses all cores.
set -euo pipefail
cd "$(dirname "$0")/.."
sanitizers=1
for arg in "$@"; do
  case "$arg" in
    --no-sanitizers) sanitizers=0 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
jobs=$(nproc)
bash scripts/setup.sh

step() { printf '\n==== %s ====\n' "$*"; }

step "build (RelWithDebInfo)"
cmake --preset default >/dev/null
cmake --build --preset default -j "$jobs"
step "tests (RelWithDebInfo)"
ctest --preset default -j "$jobs"

if ((sanitizers)); then
  # The sanitizer runs cover the concurrent and memory-sensitive parts (test labels): shim and
  # emulator under ASan+UBSan and TSan, the analyzer under ASan+UBSan.
  for preset in asan tsan; do
    step "build ($preset)"
    cmake --preset "$preset" >/dev/null
    cmake --build --preset "$preset" -j "$jobs"
    step "tests ($preset)"
    ctest --preset "$preset" -j "$jobs"
  done
fi
step "all tests passed"
