// FastClock: CLOCK_MONOTONIC nanoseconds for the hot path, from the CPU's invariant TSC.
//
// clock_gettime through the vDSO costs 20-40 ns on virtual machines, most of the per-call budget.
// Where the CPU has an invariant TSC (constant_tsc and nonstop_tsc), Now() reads the TSC and
// converts it with a (base, rate) pair that the service thread re-fits against CLOCK_MONOTONIC
// every tick (rate over the last ~second, base every tick), so readings stay within a few
// hundred nanoseconds of CLOCK_MONOTONIC and track its NTP slewing. Until the first fit, and
// on CPUs without an invariant TSC (or with FALCON_CLOCK=system), Now() is clock_gettime.
// Thread-safety: Now() from any thread (lock-free seqlock read, retried on a concurrent
// update); Init() once before use; Calibrate() from one thread (the service thread).
// Readings from different threads are comparable; consecutive readings may step back by the
// fit's residual (sub-microsecond) when the base is refreshed.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>

namespace falcon::shim {

__extension__ typedef __int128 Int128;            // GCC/Clang extension, for 64x64 products
__extension__ typedef unsigned __int128 UInt128;

inline int64_t SystemMonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

class FastClock {
 public:
  enum class Source { kSystem, kTsc };

  // Chooses the source: the TSC only if `allow_tsc` and the CPU advertises an invariant TSC.
  void Init(bool allow_tsc);
  // Service thread: samples (TSC, CLOCK_MONOTONIC) and refreshes the conversion.
  void Calibrate();
  Source source() const { return tsc_capable_ ? Source::kTsc : Source::kSystem; }

  // HOT PATH: no lock, no syscall (on the TSC path), no allocation.
  int64_t Now() const {
#if defined(__x86_64__)
    if (ready_.load(std::memory_order_relaxed)) {
      for (int attempt = 0; attempt < 4; ++attempt) {
        const uint32_t s1 = seq_.load(std::memory_order_acquire);
        const uint64_t tsc_base = tsc_base_.load(std::memory_order_relaxed);
        const int64_t ns_base = ns_base_.load(std::memory_order_relaxed);
        const uint64_t mult = mult_.load(std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_acquire);
        if ((s1 & 1) != 0 || seq_.load(std::memory_order_relaxed) != s1) continue;
        const auto delta = static_cast<int64_t>(__builtin_ia32_rdtsc() - tsc_base);
        return ns_base + static_cast<int64_t>((static_cast<Int128>(delta) * static_cast<Int128>(mult)) >> 32);
      }
    }
#endif
    return SystemMonoNs();
  }

 private:
  // Published conversion: ns = ns_base + (tsc - tsc_base) * mult / 2^32.
  std::atomic<uint32_t> seq_{0};
  std::atomic<uint64_t> tsc_base_{0};
  std::atomic<int64_t> ns_base_{0};
  std::atomic<uint64_t> mult_{0};
  std::atomic<bool> ready_{false};
  // Calibrator state (service thread only).
  bool tsc_capable_ = false;
  uint64_t anchor_tsc_ = 0;
  int64_t anchor_ns_ = 0;
  uint64_t fit_mult_ = 0;
};

}  // namespace falcon::shim
