#!/usr/bin/env bash
# The bundle runs where none of the build's packages are: scripts/bundle.sh makes one from a
# build tree, which is copied into an otherwise empty root that holds only the C library (the
# dynamic loader, libc, libm and friends, as any Linux system has); there, as root in a chroot,
# every program prints its help, redis-server starts, and falcon-agent and falcon-controller run
# against it for a few seconds and register. Also checks the size limit (< 60 MiB).
#   tests/bundle_test.sh BUILD_DIR
# Needs root (chroot); exits 77 (skipped) without it.
set -euo pipefail
build=${1:?usage: tests/bundle_test.sh BUILD_DIR}
repo="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "$build" && pwd)"
if [[ $(id -u) != 0 ]] || ! command -v chroot >/dev/null; then
  echo "bundle_test: needs root and chroot; skipped"; exit 77
fi
work=$(mktemp -d)
cleanup() {
  pkill -f "$work/root/falcon" 2>/dev/null || true
  umount "$work/root/proc" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
bash "$repo/scripts/bundle.sh" --build "$build" --no-build --out "$work/falcon"
size=$(du -sm "$work/falcon" | cut -f1)
echo "bundle_test: bundle ${size} MiB"
((size < 60)) || { echo "bundle_test: FAIL: ${size} MiB, limit 60"; exit 1; }

root="$work/root"
mkdir -p "$root"/{lib64,lib/x86_64-linux-gnu,tmp,dev,etc,proc}
chmod 1777 "$root/tmp"
# The C library only: what the bundle may assume on the target.
for f in /lib64/ld-linux-x86-64.so.2 /lib/x86_64-linux-gnu/{libc.so.6,libm.so.6,libpthread.so.0,libdl.so.2,librt.so.1,libresolv.so.2}; do
  [[ -e $f ]] && cp -L "$f" "$root$f"
done
cp -a "$work/falcon" "$root/falcon"
mknod -m 666 "$root/dev/null" c 1 3 2>/dev/null || cp -a /dev/null "$root/dev/null"
echo "127.0.0.1 localhost" > "$root/etc/hosts"
# /proc, as on any real system: the loader resolves the bundle's $ORIGIN RPATH through it.
mount -t proc proc "$root/proc" || { echo "bundle_test: cannot mount /proc in the chroot; skipped"; exit 77; }
fail=0
for p in falcon-agent falcon-controller falcon-ctl; do
  if chroot "$root" "/falcon/bin/$p" --help >/dev/null 2>"$work/err"; then
    echo "bundle_test: $p --help ok"
  else
    echo "bundle_test: FAIL: $p --help: $(cat "$work/err")"; fail=1
  fi
done
chroot "$root" /falcon/bin/redis-server --version >/dev/null && echo "bundle_test: redis-server --version ok" || { echo "bundle_test: FAIL: redis-server"; fail=1; }
port=$((20000 + RANDOM % 20000))
chroot "$root" /falcon/bin/redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir /tmp \
  --daemonize no >"$work/redis.log" 2>&1 &
for _ in $(seq 100); do
  chroot "$root" /falcon/bin/redis-cli -p "$port" PING 2>/dev/null | grep -q PONG && break
  sleep 0.1
done
mkdir -p "$root/tmp/shm"
chroot "$root" /falcon/bin/falcon-agent --job bt --host bt0 --shm-dir /tmp/shm --redis-port "$port" \
  --metrics-port 0 --heartbeat-ms 200 >"$work/agent.log" 2>&1 &
chroot "$root" /falcon/bin/falcon-controller --job bt --redis-port "$port" --heartbeat-ms 200 >"$work/ctl.log" 2>&1 &
ok=0
for _ in $(seq 100); do
  if chroot "$root" /falcon/bin/falcon-ctl status --json --job bt --port "$port" 2>/dev/null | grep -q '"bt0"'; then
    ok=1; break
  fi
  sleep 0.1
done
if ((ok)); then
  echo "bundle_test: agent and controller registered in the chroot"
else
  echo "bundle_test: FAIL: no agent in falcon-ctl status"; tail -n 5 "$work/agent.log" "$work/ctl.log"; fail=1
fi
chroot "$root" /falcon/bin/redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
pkill -f "$root/falcon" 2>/dev/null || true
kill %2 %3 2>/dev/null || true
wait 2>/dev/null || true
((fail == 0)) && echo "bundle_test: PASS" || { echo "bundle_test: FAIL"; exit 1; }
