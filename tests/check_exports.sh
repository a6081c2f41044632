#!/usr/bin/env bash
# Fails if a function declared in nccl.h has no exported wrapper in the shim, or if the shim
# exports anything that is not an NCCL function. Usage: check_exports.sh NCCL_H LIBFALCON_SHIM
set -euo pipefail
header=$1 lib=$2
declared=$(grep -oE '^(ncclResult_t|const char\*)[[:space:]]+nccl[A-Za-z0-9_]+\(' "$header" \
  | sed -E 's/.*[[:space:]](nccl[A-Za-z0-9_]+)\(/\1/' | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TW]$/ {print $3}' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
n=$(echo "$declared" | wc -l)
if [[ -n "$missing" ]]; then echo "FAIL: nccl.h functions without a shim wrapper:"; echo "$missing"; exit 1; fi
if [[ -n "$extra" ]]; then echo "FAIL: the shim exports symbols that are not in nccl.h:"; echo "$extra"; exit 1; fi
echo "ok: all $n functions of $(basename "$header") are wrapped; nothing else is exported"
