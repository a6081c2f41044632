#!/usr/bin/env bash
# Builds Falcon and runs every test: the full suite on an optimised build, then the shim,
# emulator, agent and controller unit suites again under AddressSanitizer+UBSan and
# ThreadSanitizer (and the analyzer under ASan+UBSan).
#   scripts/test.sh                 every suite but the controller end-to-end one (what CI runs)
#   scripts/test.sh --no-sanitizers the main build and suite only
#   scripts/test.sh --fuzz-seconds N  fuzz each target N s at the end (default 30; 0: none)
#   scripts/test.sh --e2e           also the controller's 16-rank end-to-end suite (~20 min; needs
#                                   two cores of its own: it is timing-sensitive on a starved VM)
# Build trees: build/ (RelWithDebInfo), build-release/ (the benchmarks, -O3),
# build-asan/, build-tsan/, build-fuzz/ (clang). Uses all cores.
set -euo pipefail
cd "$(dirname "$0")/.."
sanitizers=1
e2e=0
fuzz_seconds=30
while (($#)); do
  arg=$1
  shift
  case "$arg" in
    --fuzz-seconds)
      fuzz_seconds="${1:-}"
      shift || true
      [[ "$fuzz_seconds" =~ ^[0-9]+$ ]] || { echo "test.sh: --fuzz-seconds needs a whole number" >&2; exit 2; } ;;
    --no-sanitizers) sanitizers=0 ;;
    --e2e) e2e=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
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
if ((e2e)); then
  step "controller end-to-end suite (16 emulated ranks)"
  ctest --preset e2e
fi

# The release preset (-O3, warnings as errors) with the benchmarks: optimisation-only warnings
# (GCC's -Wrestrict false positives at -O3, say) and benchmarks that no longer compile show here.
step "build (release: the benchmarks)"
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs" --target falcon-analyzer-bench falcon-mitigation-bench \
  falcon-pipeline-bench falcon-shim-bench falcon-trap-cycles-bench falcon_emu_bench

if ((sanitizers)); then
  # The sanitizer runs cover the concurrent and memory-sensitive parts (test labels in
  # CMakePresets.json): shim, emulator and the daemons' unit suites (label daemon-unit: the
  # agent's units and its Redis worker and subscriber threads against a real redis-server, the
  # controller's units) under ASan+UBSan and TSan, the analyzer under ASan+UBSan. Only their
  # targets are built, which keeps CI well inside its time limit on two cores: the daemon
  # suites add about 9 minutes to a run of about 18 (building the daemon libraries under each
  # sanitizer, ~520 s and ~470 s of CPU; their tests take seconds).
  shim_emu=(falcon_shim falcon_nccl_noop falcon-test-calls falcon_shim_tests falcon-test-emu-comms
            falcon_shim_emu_tests falcon_nccl_emu falcon_emu_run falcon_emu_job
            emu_collectives_test emu_comm_test engine_test fault_plan_test datatypes_test device_test)
  # falcon-ctl: the hang tests run it (FlightRecorderHang, label daemon-unit; hang_progress_test).
  daemon_unit=(falcon_agent_tests falcon_controller_tests falcon_ctl_tests falcon_shmreader_tests falcon-ctl)
  for preset in asan tsan; do
    targets=("${shim_emu[@]}" "${daemon_unit[@]}")
    [[ $preset == asan ]] && targets+=(falcon_analyzer_tests falcon-fuzz)  # + fuzz corpus replays
    step "build ($preset)"
    cmake --preset "$preset" >/dev/null
    cmake --build --preset "$preset" -j "$jobs" --target "${targets[@]}"
    step "tests ($preset)"
    ctest --preset "$preset" -j "$jobs"
  done
fi
if ((fuzz_seconds > 0)); then
  step "fuzz targets (${fuzz_seconds} s each, libFuzzer)"
  bash scripts/fuzz.sh --seconds "$fuzz_seconds"
fi
step "all tests passed"
