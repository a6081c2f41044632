// Resolution of the real NCCL entry points the shim forwards to.
//
// Each FalconOp that is an NCCL function has one cached pointer. The first caller resolves it
// (dlsym(RTLD_NEXT, "pncclX"), then "ncclX"; failing that, the same names in the library named
// by FALCON_NCCL_LIBRARY or an already-loaded libnccl.so.2, for frameworks that load NCCL with
// RTLD_LOCAL); later callers read the cached pointer with one acquire load. Concurrent first
// callers may both resolve: the result is the same, so the race is benign.
// Thread-safe. The slow path may call dlsym/dlopen(RTLD_NOLOAD) and log once; the fast path
// (a cached hit) does neither.
#pragma once

#include <atomic>
#include <cstdint>

#include "falcon/shm_abi.h"

namespace falcon::shim {

// Name of the public NCCL function for `op` ("ncclAllReduce"), or "?" for non-NCCL ops.
const char* NcclFunctionName(FalconOp op);

// Slow path of RealSymbol: resolves, caches into `slot`, logs once if missing. Returns nullptr
// when no library provides the symbol.
void* ResolveRealSymbol(FalconOp op, std::atomic<void*>* slot);

// Library to search when RTLD_NEXT finds nothing (from FALCON_NCCL_LIBRARY); may be empty.
void SetFallbackLibrary(const char* path);

// One cached pointer per FalconOp that is an NCCL function (index = op).
inline constexpr int kRealSymbolSlots = 64;
extern std::atomic<void*> g_real_symbols[kRealSymbolSlots];

// Marker stored in a slot when resolution failed, so failures are not retried on every call.
inline void* const kUnresolved = reinterpret_cast<void*>(uintptr_t{1});

template <typename Fn>
inline Fn RealSymbol(FalconOp op) {
  static_assert(kFalconOpMemFree < kRealSymbolSlots, "one slot per NCCL function");
  std::atomic<void*>* slot = &g_real_symbols[static_cast<int>(op) & (kRealSymbolSlots - 1)];
  void* p = slot->load(std::memory_order_acquire);
  if (p == nullptr) p = ResolveRealSymbol(op, slot);
  if (p == nullptr || p == kUnresolved) return nullptr;
  return reinterpret_cast<Fn>(p);
}

}  // namespace falcon::shim
