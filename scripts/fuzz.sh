#!/usr/bin/env bash
# Builds the fuzz targets (preset "fuzz": clang, libFuzzer, ASan+UBSan) and runs each for a
# bounded time from its seed corpus. A crash is saved under fuzz/regressions/<target>/ (then
# replayed by every build's tests: keep it, commit it with the fix) and fails the run.
#   scripts/fuzz.sh [--seconds N] [--update-corpus] [--json FILE] [TARGET...]
#     --seconds N       fuzzing time per target (default 60)
#     --update-corpus   merge the inputs that found new coverage into fuzz/corpus/<target>/
#     --json FILE       also write the per-target figures as JSON
#     TARGET            segment_open segment_live plan_block protocol controller_input
#                       agent_config controller_config analyze_trace_csv analyze_trace_records
#                       (default: all)
# Needs clang and libFuzzer (scripts/setup.sh installs them). Runs one target at a time on one
# core. Exit: 0 when no target crashed, 1 when one did, 2 on a usage error.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
update=0
json=""
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds="${2:?--seconds needs a value}"; shift 2 ;;
    --update-corpus) update=1; shift ;;
    --json) json="${2:?--json needs a file}"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || ((seconds < 1)); then
  echo "fuzz.sh: --seconds must be a whole number of seconds >= 1, not '$seconds'" >&2
  exit 2
fi
all=(segment_open segment_live plan_block protocol controller_input agent_config controller_config
     analyze_trace_csv analyze_trace_records)
((${#targets[@]})) || targets=("${all[@]}")
for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (known: ${all[*]})" >&2; exit 2; }
done
if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ not found: run scripts/setup.sh" >&2
  exit 2
fi

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)"

work=build-fuzz/work
results=()
crashed=0
printf '%-22s %8s %8s %10s %8s %8s %8s %8s\n' target seconds cpu_s execs exec/s cov corpus crashes
for t in "${targets[@]}"; do
  exe=build-fuzz/fuzz/falcon-fuzz-$t
  corpus=fuzz/corpus/$t
  regress=fuzz/regressions/$t
  mkdir -p "$work/$t" "$regress"
  rm -rf "${work:?}/$t/corpus" && mkdir -p "$work/$t/corpus"
  cp -r "$corpus"/. "$work/$t/corpus/" 2>/dev/null || true
  log=$work/$t/log
  before=$(find "$regress" -type f ! -name '.*' | wc -l)
  # -max_len: the segment and plan-block inputs describe whole images; others stay small.
  rc=0
  # CPU time (user + system) of the fuzzer, when /usr/bin/time is there: on a shared machine the
  # wall-clock seconds say little about how much fuzzing was done.
  timer=()
  [[ -x /usr/bin/time ]] && timer=(/usr/bin/time -f '%U %S' -o "$work/$t/cpu")
  rm -f "$work/$t/cpu"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "${timer[@]}" "$exe" "$work/$t/corpus" -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$regress/" >"$log" 2>&1 || rc=$?
  after=$(find "$regress" -type f ! -name '.*' | wc -l)
  found=$((after - before))
  if ((rc != 0)) && ((found == 0)); then found=1; fi  # died without an artifact: still a failure
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  units=$(find "$work/$t/corpus" -type f | wc -l)
  cpu=$(tail -1 "$work/$t/cpu" 2>/dev/null | awk 'NF == 2 {printf "%.1f", $1 + $2}')
  printf '%-22s %8s %8s %10s %8s %8s %8s %8s\n' "$t" "$seconds" "${cpu:--}" "${execs:-0}" "${rate:-0}" "${cov:-0}" "$units" "$found"
  results+=("{\"target\": \"$t\", \"seconds\": $seconds, \"cpu_s\": ${cpu:-null}, \"execs\": ${execs:-0}, \"exec_per_s\": ${rate:-0}, \"cov\": ${cov:-0}, \"corpus\": $units, \"crashes\": $found}")
  if ((found)); then
    crashed=1
    echo "fuzz.sh: $t crashed; input saved in $regress/, log: $log" >&2
    grep -m1 -A12 'ERROR\|fuzz property failed\|deadly signal' "$log" >&2 || tail -20 "$log" >&2
  fi
  if ((update)); then
    "$exe" -merge=1 "$corpus" "$work/$t/corpus" -max_len=8192 >/dev/null 2>&1 || true
  fi
done
if [[ -n "$json" ]]; then
  (IFS=,; printf '[%s]\n' "${results[*]}") >"$json"
fi
exit "$crashed"
