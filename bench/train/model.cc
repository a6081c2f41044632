// Compute model and payloads; see model.h.
#include "model.h"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>

namespace falcon::train {

double MonotonicSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void SleepFor(double seconds) {
  if (seconds <= 0) return;
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const long long t = static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec +
                      static_cast<long long>(seconds * 1e9);
  timespec deadline{};
  deadline.tv_sec = static_cast<time_t>(t / 1000000000LL);
  deadline.tv_nsec = static_cast<long>(t % 1000000000LL);
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, nullptr) == EINTR) {
  }
}

double ComputeModel::Observe() {
  double f = factor_ ? factor_(clock_ ? clock_() : 0) : 1;
  if (!(f >= 1)) f = 1;  // also maps NaN to 1
  max_factor_ = std::max(max_factor_, f);
  return f;
}

double ComputeModel::Run(double base_ms) {
  if (base_ms <= 0) return 1;
  const double f = Observe();
  SleepFor(base_ms * f * 1e-3);
  return f;
}

double ComputeModel::TakeMaxFactor() {
  const double f = max_factor_;
  max_factor_ = 1;
  return f;
}

std::uint64_t PayloadKey(PayloadTag tag, std::initializer_list<std::int64_t> fields) {
  std::uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](std::int64_t v) {
    h ^= static_cast<std::uint64_t>(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 1099511628211ULL;
  };
  mix(static_cast<std::int64_t>(tag));
  for (std::int64_t f : fields) mix(f);
  return h;
}

void FillPayload(std::span<float> buf, std::uint64_t key) {
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = PayloadValue(key, i);
}

void AddPayload(std::span<float> buf, std::uint64_t key) {
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] += PayloadValue(key, i);
}

std::optional<Mismatch> VerifySample(std::span<const float> buf, const std::function<float(std::size_t)>& expect,
                                     std::uint64_t rotation, double rel_tolerance) {
  const std::size_t n = buf.size();
  if (n == 0) return std::nullopt;
  const std::size_t stride = std::max<std::size_t>(1, n / 4096);
  auto bad = [&](std::size_t i) -> std::optional<Mismatch> {
    const float e = expect(i);
    const float g = buf[i];
    const bool ok = rel_tolerance == 0
                        ? g == e
                        : std::fabs(static_cast<double>(g) - static_cast<double>(e)) <=
                              rel_tolerance * std::max(1.0, std::fabs(static_cast<double>(e)));
    if (ok) return std::nullopt;
    return Mismatch{i, g, e};
  };
  for (std::size_t i = rotation % stride; i < n; i += stride) {
    if (auto m = bad(i)) return m;
  }
  return bad(n - 1);
}

float GradValue(const GradKeyFn& key_of_mb, int micro_batches, std::size_t i) {
  float g = 0;
  for (int mb = 0; mb < micro_batches; ++mb) g += PayloadValue(key_of_mb(mb), i);
  return g;
}

float ReplicaWeight(int m, const std::vector<int>& all_m) {
  long long total = 0;
  for (int x : all_m) total += x;
  return total > 0 ? static_cast<float>(static_cast<double>(m) / static_cast<double>(total)) : 0.0f;
}

float WeightedGradSum(const std::vector<GradKeyFn>& keys, const std::vector<int>& all_m, std::size_t i) {
  float acc = 0;
  for (std::size_t d = 0; d < keys.size(); ++d) {
    const float c = GradValue(keys[d], all_m[d], i) * ReplicaWeight(all_m[d], all_m);
    acc = d == 0 ? c : acc + c;
  }
  return acc;
}

std::string DescribeMismatch(const std::string& what, const Mismatch& m) {
  char buf[160];
  std::snprintf(buf, sizeof buf, ": element %zu = %.9g, expected %.9g", m.index, static_cast<double>(m.got),
                static_cast<double>(m.expected));
  return what + buf;
}

}  // namespace falcon::train
