// Template body of falcon::testing::WaitUntil (see subprocess.h).
#pragma once

#include <time.h>

namespace falcon::testing {

template <typename Cond>
bool WaitUntil(Cond cond, double timeout_s) {
  timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    if (cond()) return true;
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double elapsed = static_cast<double>(now.tv_sec - start.tv_sec) + static_cast<double>(now.tv_nsec - start.tv_nsec) / 1e9;
    if (elapsed > timeout_s) return cond();
    timespec ts{0, 10 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }
}

}  // namespace falcon::testing
