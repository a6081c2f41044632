#!/usr/bin/env bash
# deploy/ checked with real parts:
#   1. the systemd units pass `systemd-analyze verify` (no warning at all) in a root holding the
#      programs where the units expect them;
#   2. the Prometheus config and alert rules pass `promtool check`;
#   3. a real Prometheus scrapes a running falcon-agent and falcon-controller (against a real
#      redis-server), and a query returns each one's series;
#   4. every metric the alert rules and the Grafana dashboard use is one the agent or the
#      controller exposes (so renaming a metric breaks this test, not a user's alerts);
#   5. the Kubernetes manifests parse, and the agent and the training pod share one segment
#      directory, and every Secret they reference exists.
# Usage: tests/deploy_test.sh BUILD_DIR. Exit 77 (skipped) when a tool is missing.
set -euo pipefail
build="$(cd "${1:?usage: tests/deploy_test.sh BUILD_DIR}" && pwd)"
repo="$(cd "$(dirname "$0")/.." && pwd)"
deploy="$repo/deploy"
for tool in systemd-analyze promtool prometheus redis-server python3; do
  command -v "$tool" >/dev/null || { echo "deploy_test: $tool not found (scripts/setup.sh); skipped"; exit 77; }
done
python3 -c "import yaml" 2>/dev/null || { echo "deploy_test: python3-yaml missing; skipped"; exit 77; }
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "deploy_test: FAIL: $*"; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# 1. systemd units, in a root that has the system's units and Falcon under /opt/falcon.
root="$work/root"
mkdir -p "$root/opt/falcon/bin" "$root/etc/systemd/system" "$root/usr/lib/systemd"
cp "$build/daemon/falcon-agent" "$build/daemon/falcon-controller" "$root/opt/falcon/bin/"
cp -a /lib/systemd/system "$root/usr/lib/systemd/"
cp "$deploy"/systemd/*.service "$root/etc/systemd/system/"
for unit in falcon-agent.service falcon-controller@train1.service; do
  out=$(systemd-analyze verify --root="$root" "/etc/systemd/system/$unit" 2>&1) || fail "systemd-analyze verify $unit: $out"
  [[ -z $out ]] || fail "systemd-analyze verify $unit warned: $out"
  echo "deploy_test: systemd-analyze verify $unit: clean"
done

# 2. promtool.
promtool check config "$deploy/prometheus/prometheus.yml" >/dev/null || fail "promtool check config"
promtool check rules "$deploy/prometheus/falcon-rules.yml" >/dev/null || fail "promtool check rules"
echo "deploy_test: promtool check config / rules: ok"

# 3. A live agent and controller, scraped by Prometheus.
rport=$(free_port); aport=$(free_port); cport=$(free_port); pport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do redis-cli -p "$rport" PING 2>/dev/null | grep -q PONG && break; sleep 0.1; done
mkdir -p "$work/shm"
"$build/daemon/falcon-agent" --job deploy --host node0 --shm-dir "$work/shm" --redis-port "$rport" \
  --metrics-port "$aport" --heartbeat-ms 200 >"$work/agent.log" 2>&1 &
pids+=($!)
"$build/daemon/falcon-controller" --job deploy --redis-port "$rport" --metrics-port "$cport" \
  --heartbeat-ms 200 >"$work/controller.log" 2>&1 &
pids+=($!)
cat >"$work/prometheus.yml" <<EOF
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: ["$deploy/prometheus/falcon-rules.yml"]
scrape_configs:
  - job_name: falcon-agents
    honor_labels: true
    static_configs: [{targets: ["127.0.0.1:$aport"]}]
  - job_name: falcon-controllers
    honor_labels: true
    static_configs: [{targets: ["127.0.0.1:$cport"]}]
EOF
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$pport" >"$work/prometheus.log" 2>&1 &
pids+=($!)
query() {
  python3 - "$pport" "$1" <<'PY'
import json, sys, urllib.parse, urllib.request
port, q = sys.argv[1], sys.argv[2]
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(q)}", timeout=2) as r:
        d = json.load(r)
    print(len(d["data"]["result"]) if d.get("status") == "success" else 0)
except Exception:
    print(0)
PY
}
for q in 'falcon_agent_polls_total{job="deploy",host="node0"}' 'falcon_controller_phase{job="deploy",phase="tracking"} == 1'; do
  got=0
  for _ in $(seq 120); do
    got=$(query "$q")
    [[ $got -gt 0 ]] && break
    sleep 0.5
  done
  [[ $got -gt 0 ]] || fail "Prometheus never returned $q (agent: $(tail -n 3 "$work/agent.log"), controller: $(tail -n 3 "$work/controller.log"))"
  echo "deploy_test: Prometheus query $q: $got series"
done

# 4. Every metric the rules and the dashboard use exists.
exposed=$(for p in "$aport" "$cport"; do
  python3 -c "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" \
    "http://127.0.0.1:$p/metrics"
done | awk '/^# TYPE /{print $3}' | sort -u)
used=$(grep -ohE 'falcon_(agent|controller)_[a-z_]+' "$deploy/prometheus/falcon-rules.yml" "$deploy/grafana/falcon-dashboard.json" | sort -u)
missing=$(comm -23 <(echo "$used") <(echo "$exposed"))
[[ -z $missing ]] || fail "rules / dashboard use metrics nobody exposes: $missing"
echo "deploy_test: $(echo "$used" | wc -l) metrics used by the rules and the dashboard, all exposed"

# 5. Kubernetes manifests.
python3 - "$deploy/kubernetes" <<'PY' || fail "Kubernetes manifests"
import glob, sys, yaml
docs = []
for path in sorted(glob.glob(sys.argv[1] + "/*.yaml")):
    with open(path) as f:
        docs += [(path, d) for d in yaml.safe_load_all(f) if d]
secrets = {d["metadata"]["name"] for _, d in docs if d["kind"] == "Secret"}
shm = {}
for path, d in docs:
    for key in ("apiVersion", "kind", "metadata"):
        assert key in d, f"{path}: a document without {key}"
    spec = d.get("spec", {})
    pod = spec.get("template", {}).get("spec") if "template" in spec else (spec if d["kind"] == "Pod" else None)
    if not pod:
        continue
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            assert not ref or ref["name"] in secrets, f"{path}: {c['name']} needs Secret {ref['name']}"
    for v in pod.get("volumes", []):
        if v["name"] == "falcon-shm":
            shm[d["metadata"]["name"]] = v["hostPath"]["path"]
assert "falcon-agent" in shm and len(set(shm.values())) == 1, f"agent and training pods must share one hostPath: {shm}"
print(f"deploy_test: {len(docs)} Kubernetes objects; the agent and the training pod share {shm['falcon-agent']}")
PY
echo "deploy_test: PASS"
