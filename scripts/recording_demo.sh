#!/usr/bin/env bash
# Falcon recording demo: an emulated 4-rank hybrid-parallel job (TP 2 x DP 2, 2 ranks per emulated node)
# runs over the CPU NCCL emulator with libfalcon_shim.so preloaded; then the calls each rank
# recorded are shown (falcon-ctl segments / trace) and the detection core finds the iteration
# period and iteration times from the recording alone (falcon-ctl analyze-trace --records).
# Does all set-up itself (packages, build). Cleans up everything it made, also on Ctrl-C.
#   scripts/recording_demo.sh [--ranks N] [--iters N] [--compute-ms MS] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=4 iters=300 compute_ms=5 keep=0
while (($#)); do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --compute-ms) compute_ms=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "recording_demo.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "set-up: system packages and build (first run takes a few minutes)"
bash scripts/build.sh falcon_shim falcon-ctl falcon_nccl_emu falcon_emu_run falcon_emu_job

B=build
work=$(mktemp -d "${TMPDIR:-/tmp}/falcon-demo-XXXXXX")
cleanup() {
  if ((keep)); then echo "kept segments and dumps in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM
export FALCON_SHM_DIR=$work FALCON_KEEP_SEGMENT=1 FALCON_JOB=demo

say "run: $ranks ranks x $iters iterations under the shim (falcon-emu-run --preload libfalcon_shim.so)"
"$B/bench/emu/falcon-emu-run" -n "$ranks" --ranks-per-node 2 --preload "$PWD/$B/shim/libfalcon_shim.so" \
  -- "$B/bench/emu/falcon-emu-job" --iters "$iters" --compute-ms "$compute_ms" --check

say "what the shim recorded: one shared-memory segment per rank (falcon-ctl segments)"
"$B/daemon/falcon-ctl" segments

first=$(ls "$work" | grep '^falcon\.' | head -n 1)
pid=${first##*.}
say "the first 24 calls of pid $pid (falcon-ctl trace $pid -n 24)"
"$B/daemon/falcon-ctl" trace "$pid" -n 24

cat > "$work/summary.py" <<'PY'
import json, statistics, sys
d = json.load(sys.stdin)
for proc in d["processes"]:
    it = proc["iteration_seconds"]
    periods = ", ".join(str(x["period"]) for x in proc["periods"])
    if it:
        print("  pid %s: period %s calls/iteration, %d iterations, median %.2f ms, %d alarm(s)"
              % (proc["pid"], periods, len(it), statistics.median(it) * 1e3, len(proc["alarms"])))
        for a in proc["alarms"]:
            print("      %-9s at iteration %d (onset %d), %.2fx the healthy level"
                  % (a["type"], a["at"], a["onset"], a["ratio"]))
    else:
        print("  pid %s: no period found" % proc["pid"])
PY
say "per rank: period and iteration times found from the recorded calls alone (falcon-ctl analyze-trace --records)"
for seg in "$work"/falcon.*; do
  p=${seg##*.}
  "$B/daemon/falcon-ctl" trace --file "$seg" --json > "$work/rank-$p.jsonl"
  "$B/daemon/falcon-ctl" analyze-trace --records --json "$work/rank-$p.jsonl" | python3 "$work/summary.py"
done
say "done: the job's own mean iteration time is in its [rank R] lines above, for comparison"
echo "(alarms here mean the job really slowed down, e.g. when other work shares this machine's cores)"
