// Real NCCL symbol resolution: see real_nccl.h.
#include "shim/real_nccl.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>

#include "shim/log.h"

namespace falcon::shim {

std::atomic<void*> g_real_symbols[kRealSymbolSlots];

namespace {

struct OpName {
  FalconOp op;
  const char* name;
};

// Every function declared in nccl.h 2.28, keyed by its op code.
constexpr OpName kNames[] = {
    {kFalconOpAllReduce, "ncclAllReduce"},
    {kFalconOpBroadcast, "ncclBroadcast"},
    {kFalconOpBcast, "ncclBcast"},
    {kFalconOpReduce, "ncclReduce"},
    {kFalconOpAllGather, "ncclAllGather"},
    {kFalconOpReduceScatter, "ncclReduceScatter"},
    {kFalconOpAlltoAll, "ncclAlltoAll"},
    {kFalconOpGather, "ncclGather"},
    {kFalconOpScatter, "ncclScatter"},
    {kFalconOpSend, "ncclSend"},
    {kFalconOpRecv, "ncclRecv"},
    {kFalconOpGroupStart, "ncclGroupStart"},
    {kFalconOpGroupEnd, "ncclGroupEnd"},
    {kFalconOpGroupSimulateEnd, "ncclGroupSimulateEnd"},
    {kFalconOpCommInitRank, "ncclCommInitRank"},
    {kFalconOpCommInitRankConfig, "ncclCommInitRankConfig"},
    {kFalconOpCommInitRankScalable, "ncclCommInitRankScalable"},
    {kFalconOpCommInitAll, "ncclCommInitAll"},
    {kFalconOpCommSplit, "ncclCommSplit"},
    {kFalconOpCommShrink, "ncclCommShrink"},
    {kFalconOpCommFinalize, "ncclCommFinalize"},
    {kFalconOpCommDestroy, "ncclCommDestroy"},
    {kFalconOpCommAbort, "ncclCommAbort"},
    {kFalconOpCommRevoke, "ncclCommRevoke"},
    {kFalconOpCommRegister, "ncclCommRegister"},
    {kFalconOpCommDeregister, "ncclCommDeregister"},
    {kFalconOpCommWindowRegister, "ncclCommWindowRegister"},
    {kFalconOpCommWindowDeregister, "ncclCommWindowDeregister"},
    {kFalconOpRedOpCreatePreMulSum, "ncclRedOpCreatePreMulSum"},
    {kFalconOpRedOpDestroy, "ncclRedOpDestroy"},
    {kFalconOpGetUniqueId, "ncclGetUniqueId"},
    {kFalconOpGetVersion, "ncclGetVersion"},
    {kFalconOpGetErrorString, "ncclGetErrorString"},
    {kFalconOpGetLastError, "ncclGetLastError"},
    {kFalconOpCommGetAsyncError, "ncclCommGetAsyncError"},
    {kFalconOpCommCount, "ncclCommCount"},
    {kFalconOpCommCuDevice, "ncclCommCuDevice"},
    {kFalconOpCommUserRank, "ncclCommUserRank"},
    {kFalconOpMemAlloc, "ncclMemAlloc"},
    {kFalconOpMemFree, "ncclMemFree"},
};

char g_fallback_library[256];

void* LookupIn(void* handle, const char* name) {
  char pname[96];
  std::snprintf(pname, sizeof(pname), "p%s", name);
  void* p = dlsym(handle, pname);
  if (p == nullptr) p = dlsym(handle, name);
  return p;
}

void* LookupFallback(const char* name) {
  const char* lib = g_fallback_library[0] != '\0' ? g_fallback_library : "libnccl.so.2";
  // RTLD_NOLOAD: never load a second NCCL into the process, only find the one it already has,
  // unless the operator named a library explicitly.
  int flags = RTLD_LAZY | RTLD_LOCAL | (g_fallback_library[0] != '\0' ? 0 : RTLD_NOLOAD);
  void* handle = dlopen(lib, flags);
  if (handle == nullptr) return nullptr;
  void* p = LookupIn(handle, name);
  // Do not dlclose: the pointer must stay valid for the life of the process.
  return p;
}

}  // namespace

const char* NcclFunctionName(FalconOp op) {
  for (const OpName& n : kNames) {
    if (n.op == op) return n.name;
  }
  return "?";
}

void SetFallbackLibrary(const char* path) {
  std::snprintf(g_fallback_library, sizeof(g_fallback_library), "%s", path);
}

void* ResolveRealSymbol(FalconOp op, std::atomic<void*>* slot) {
  const char* name = NcclFunctionName(op);
  void* p = LookupIn(RTLD_NEXT, name);
  if (p == nullptr) p = LookupFallback(name);
  if (p == nullptr) {
    LogOnce(OnceKey::kMissingSymbol, LogLevel::kWarn,
            "the NCCL library in this process lacks %s (and possibly others); such calls return "
            "ncclInvalidUsage",
            name);
    slot->store(kUnresolved, std::memory_order_release);
    return nullptr;
  }
  slot->store(p, std::memory_order_release);
  return p;
}

}  // namespace falcon::shim
