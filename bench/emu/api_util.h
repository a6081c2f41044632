// Helpers for the exported C entry points of the emulator (api_*.cc): the export macros and the
// exception fence.
//
// Every exported function `pncclX` is the implementation; `ncclX` is a weak alias of it, as in
// the real libnccl, so a profiler or an LD_PRELOAD shim can interpose either name.
// Thread-safety: stateless. Must never: let an exception cross the C ABI.
#ifndef FALCON_BENCH_EMU_API_UTIL_H_
#define FALCON_BENCH_EMU_API_UTIL_H_

#include <nccl.h>

#include <exception>
#include <new>
#include <string>

#include "comm.h"

#define FALCON_EMU_EXPORT extern "C" __attribute__((visibility("default")))
// Declares ncclNAME as a weak alias of pncclNAME (which must be defined in the same file).
#define FALCON_EMU_ALIAS(ret, name, params) \
  FALCON_EMU_EXPORT ret name params __attribute__((weak, alias("p" #name)))

namespace falcon::emu {

// Runs `body` (returning ncclResult_t); converts any exception into an error result.
template <class F>
ncclResult_t Guarded(const char* name, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(ncclSystemError, nullptr, std::string(name) + ": out of memory", Loud::kYes);
  } catch (const std::exception& e) {
    return Fail(ncclInternalError, nullptr, std::string(name) + ": internal error: " + e.what(), Loud::kYes);
  } catch (...) {
    // Not swallowed: reported as ncclInternalError with the last-error text set.
    return Fail(ncclInternalError, nullptr, std::string(name) + ": unknown internal error", Loud::kYes);
  }
}

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_API_UTIL_H_
