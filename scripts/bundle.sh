#!/usr/bin/env bash
# Makes a self-contained Falcon bundle for machines where nothing can be installed (a GPU node
# without network, a container image): Falcon's programs and shim, redis-server and redis-cli,
# every shared library they need except the C library itself (glibc >= the build machine's, 2.36
# on Debian 12), the GPU kit, the examples and the Python package.
#
#   scripts/bundle.sh [--build DIR] [--out DIR] [--tar] [--no-build] [--no-emulators]
#
#   --build DIR      build tree to take the programs from (default build-release, configured and
#                    built with the release preset unless --no-build)
#   --out DIR        where the bundle goes (default falcon-bundle); replaced if it exists
#   --tar            also write DIR.tar.gz
#   --no-emulators   leave out the NCCL / CUDA / cuBLAS emulators (gpu_check.sh --emulated needs them)
#
# Layout: bin/ (falcon-agent, falcon-controller, falcon-ctl, redis-server, redis-cli; RPATH
# $ORIGIN/../lib), lib/ (libfalcon_shim.so and the programs' libraries), emu/ (falcon-emu-run,
# falcon-train-emu, and the NCCL emulator in emu/nccl, the CUDA and cuBLAS emulators in emu/cuda),
# scripts/ (gpu_check.sh, gpu_kit/), examples/, python/, config/, VERSION. The shim is loaded into
# training processes with LD_PRELOAD=<bundle>/lib/libfalcon_shim.so; it needs only the C and C++
# runtime libraries every PyTorch process already has.
# Checked by tests/bundle_test.sh: the bundle's programs run in an empty root holding nothing but
# the C library.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-release
out=falcon-bundle
tar=0
do_build=1
emulators=1
while (($#)); do
  case "$1" in
    --build) build="${2:?--build needs a directory}"; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --tar) tar=1; shift ;;
    --no-build) do_build=0; shift ;;
    --no-emulators) emulators=0; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "bundle.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
command -v patchelf >/dev/null || { echo "bundle.sh: patchelf is needed (scripts/setup.sh installs it)" >&2; exit 3; }
redis_server=$(command -v redis-server || true)
redis_cli=$(command -v redis-cli || true)
[[ -n $redis_server && -n $redis_cli ]] || { echo "bundle.sh: redis-server / redis-cli not found (scripts/setup.sh)" >&2; exit 3; }

targets=(falcon_shim falcon-agent falcon-controller falcon-ctl)
((emulators)) && targets+=(falcon_nccl_emu falcon_cuda_emu falcon_cublas_emu falcon_emu_run falcon-train-emu)
if ((do_build)); then
  if [[ $build == build-release ]]; then
    cmake --preset release >/dev/null
  fi
  cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
fi

rm -rf "$out"
mkdir -p "$out"/{bin,lib,scripts,config}
install -m 0755 "$build"/daemon/falcon-agent "$build"/daemon/falcon-controller "$build"/daemon/falcon-ctl "$out"/bin/
install -m 0755 "$redis_server" "$redis_cli" "$out"/bin/
install -m 0755 "$build"/shim/libfalcon_shim.so "$out"/lib/
# The Flight Recorder converter, where falcon-ctl hang looks for it (bin/../share/falcon/; needs python3).
install -D -m 0755 scripts/falcon-flight-recorder "$out"/share/falcon/falcon-flight-recorder
if ((emulators)); then
  mkdir -p "$out"/emu/nccl "$out"/emu/cuda
  install -m 0755 "$build"/bench/emu/falcon-emu-run "$build"/bench/train/falcon-train-emu "$out"/emu/
  cp -L "$build"/emu-lib/libnccl.so.2 "$out"/emu/nccl/
  cp -L "$build"/cuda-emu-lib/libcuda.so.1 "$build"/cuda-emu-lib/libcublas.so.13 "$out"/emu/cuda/
fi

# The programs' shared libraries, except the C library family (the target's own must be used).
is_libc() {
  case "$(basename "$1")" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libresolv.so.*|libutil.so.*|linux-vdso*) return 0 ;;
  esac
  return 1
}
bins=("$out"/bin/*)
((emulators)) && bins+=("$out"/emu/falcon-emu-run "$out"/emu/falcon-train-emu)
for b in "${bins[@]}"; do
  while read -r path; do
    [[ -n $path && -e $path ]] || continue
    is_libc "$path" && continue
    [[ -e $out/lib/$(basename "$path") ]] || cp -L "$path" "$out"/lib/
  done < <(ldd "$b" | awk '/=> \// {print $3}')
done
for b in "$out"/bin/*; do
  strip --strip-unneeded "$b" 2>/dev/null || true
  patchelf --set-rpath '$ORIGIN/../lib' "$b"
done
if ((emulators)); then
  for b in "$out"/emu/falcon-emu-run "$out"/emu/falcon-train-emu; do
    strip --strip-unneeded "$b" 2>/dev/null || true
    patchelf --set-rpath '$ORIGIN:$ORIGIN/../lib' "$b"
  done
fi
for l in "$out"/lib/*.so*; do
  [[ $(basename "$l") == libfalcon_shim.so ]] && { strip --strip-unneeded "$l" 2>/dev/null || true; continue; }
  patchelf --set-rpath '$ORIGIN' "$l" 2>/dev/null || true
done

cp -r scripts/gpu_check.sh scripts/gpu_kit "$out"/scripts/
find "$out"/scripts -name __pycache__ -prune -exec rm -rf {} +
cp -r examples python "$out"/
find "$out"/python "$out"/examples -name __pycache__ -prune -exec rm -rf {} +
cp config/*.conf "$out"/config/
{
  echo "falcon $(git describe --always --dirty 2>/dev/null || echo unknown)"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  echo "build tree $build"
} > "$out"/VERSION
size=$(du -sm "$out" | cut -f1)
echo "bundle.sh: $out: ${size} MiB"
if ((tar)); then
  tar -czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
  echo "bundle.sh: $out.tar.gz: $(du -m "$out.tar.gz" | cut -f1) MiB"
fi
if ((size >= 60)); then
  echo "bundle.sh: the bundle is ${size} MiB, above the 60 MiB it must stay under" >&2
  exit 1
fi
