#!/usr/bin/env bash
# Fails if a function declared in nccl.h or in Falcon's C API (falcon.h) has no export in the
# shim, or if the shim exports anything else.
# Usage: check_exports.sh NCCL_H LIBFALCON_SHIM FALCON_H
set -euo pipefail
header=$1 lib=$2 api=$3
declared=$(grep -oE '^(ncclResult_t|const char\*)[[:space:]]+nccl[A-Za-z0-9_]+\(' "$header" \
  | sed -E 's/.*[[:space:]](nccl[A-Za-z0-9_]+)\(/\1/' | sort -u)
falcon_api=$(grep -oE '^(int|uint32_t)[[:space:]]+falcon[A-Za-z0-9_]+\(' "$api" \
  | sed -E 's/.*[[:space:]](falcon[A-Za-z0-9_]+)\(/\1/' | sort -u)
if [[ -z "$falcon_api" ]]; then echo "FAIL: no function found in $api"; exit 1; fi
allowed=$(printf '%s\n%s\n' "$declared" "$falcon_api" | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TW]$/ {print $3}' | sort -u)
missing=$(comm -23 <(echo "$allowed") <(echo "$exported"))
extra=$(comm -13 <(echo "$allowed") <(echo "$exported"))
n=$(echo "$declared" | wc -l)
m=$(echo "$falcon_api" | wc -l)
if [[ -n "$missing" ]]; then echo "FAIL: nccl.h / falcon.h functions the shim does not export:"; echo "$missing"; exit 1; fi
if [[ -n "$extra" ]]; then echo "FAIL: the shim exports symbols that are in neither nccl.h nor falcon.h:"; echo "$extra"; exit 1; fi
echo "ok: all $n functions of $(basename "$header") are wrapped, all $m of $(basename "$api") exported; nothing else is"
