// FastClock calibration: see fast_clock.h.
#include "shim/fast_clock.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

namespace falcon::shim {
namespace {

constexpr int64_t kFirstFitNs = 20 * 1000 * 1000;        // first rate after 20 ms
constexpr int64_t kRefitNs = 1000LL * 1000 * 1000;       // rate over ~1 s windows after that
constexpr uint64_t kMaxSampleTicks = 20000;              // reject samples interrupted mid-way

bool CpuHasInvariantTsc() {
#if defined(__x86_64__)
  int fd = open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  static char buf[16384];  // init-time only; the first CPU's flags line is near the top
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* flags = std::strstr(buf, "\nflags");
  if (flags == nullptr) return false;
  const char* eol = std::strchr(flags + 1, '\n');
  auto has = [&](const char* f) {
    const char* p = std::strstr(flags, f);
    return p != nullptr && (eol == nullptr || p < eol);
  };
  return has(" constant_tsc") && has(" nonstop_tsc");
#else
  return false;
#endif
}

#if defined(__x86_64__)
// One (TSC, CLOCK_MONOTONIC) pair; false if the reading was interrupted (preemption).
bool Sample(uint64_t* tsc, int64_t* ns) {
  for (int i = 0; i < 5; ++i) {
    const uint64_t a = __builtin_ia32_rdtsc();
    const int64_t t = SystemMonoNs();
    const uint64_t b = __builtin_ia32_rdtsc();
    if (b - a < kMaxSampleTicks) {
      *tsc = a + (b - a) / 2;
      *ns = t;
      return true;
    }
  }
  return false;
}
#endif

}  // namespace

void FastClock::Init(bool allow_tsc) {
  tsc_capable_ = allow_tsc && CpuHasInvariantTsc();
  ready_.store(false, std::memory_order_relaxed);
  fit_mult_ = 0;
#if defined(__x86_64__)
  if (tsc_capable_ && !Sample(&anchor_tsc_, &anchor_ns_)) tsc_capable_ = false;
#endif
}

void FastClock::Calibrate() {
#if defined(__x86_64__)
  if (!tsc_capable_) return;
  uint64_t tsc = 0;
  int64_t ns = 0;
  if (!Sample(&tsc, &ns) || tsc <= anchor_tsc_) return;
  const int64_t span = ns - anchor_ns_;
  if (fit_mult_ == 0 && span < kFirstFitNs) return;
  if (fit_mult_ == 0 || span >= kRefitNs) {
    fit_mult_ = static_cast<uint64_t>((static_cast<UInt128>(span) << 32) / (tsc - anchor_tsc_));
    anchor_tsc_ = tsc;
    anchor_ns_ = ns;
  }
  seq_.fetch_add(1, std::memory_order_acq_rel);  // odd: update in progress
  tsc_base_.store(tsc, std::memory_order_relaxed);
  ns_base_.store(ns, std::memory_order_relaxed);
  mult_.store(fit_mult_, std::memory_order_relaxed);
  seq_.fetch_add(1, std::memory_order_release);
  ready_.store(true, std::memory_order_relaxed);
#endif
}

}  // namespace falcon::shim
