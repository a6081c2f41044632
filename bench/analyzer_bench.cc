// Micro-benchmarks of the analyzer's detection core: BOCD throughput with pruning, the full
// detector per sample, period detection on a 100,000-call window, and memory per tracked rank.
// Run: falcon-analyzer-bench [--benchmark_filter=...]. Prints a '#' preamble with the config.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "analyzer/bocd.h"
#include "analyzer/detector.h"
#include "analyzer/period.h"
#include "analyzer/period_tracker.h"

namespace {

using falcon::analyzer::Bocd;
using falcon::analyzer::FailSlowDetector;

std::vector<double> Noise(std::size_t n, double level, double sigma, std::uint64_t seed) {
  std::vector<double> out(n);
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (double& v : out) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const double u1 = (static_cast<double>(s >> 11) + 0.5) * 0x1.0p-53;
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const double u2 = static_cast<double>(s >> 11) * 0x1.0p-53;
    v = level + sigma * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  return out;
}

void BM_BocdUpdate(benchmark::State& state) {
  const auto xs = Noise(1 << 16, 0.0, 0.02, 1);
  falcon::analyzer::BocdOptions options;
  options.max_hypotheses = static_cast<std::size_t>(state.range(0));
  falcon::analyzer::NormalGammaPrior prior;
  prior.beta = 0.02 * 0.02;
  Bocd bocd(options, prior);
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(bocd.Update(xs[i++ & 0xffff]));
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
  state.counters["bytes"] = static_cast<double>(bocd.MemoryBytes());
}
BENCHMARK(BM_BocdUpdate)->Arg(16)->Arg(32)->Arg(64);

// 10^7 samples through BOCD: throughput and numerical stability (log evidence stays finite).
void BM_Bocd10M(benchmark::State& state) {
  const auto xs = Noise(1 << 16, 1.0, 0.02, 2);
  for (auto _ : state) {
    falcon::analyzer::NormalGammaPrior prior;
    prior.mu = 1.0;
    prior.beta = 0.02 * 0.02;
    Bocd bocd({}, prior);
    std::size_t non_finite = 0;
    for (std::size_t i = 0; i < 10000000; ++i) {
      non_finite += std::isfinite(bocd.Update(xs[i & 0xffff])) ? 0U : 1U;
    }
    state.counters["non_finite"] = static_cast<double>(non_finite);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * 10000000);
}
BENCHMARK(BM_Bocd10M)->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_DetectorPush(benchmark::State& state) {
  auto xs = Noise(1 << 16, 0.0, 0.02, 3);
  for (double& x : xs) x = std::exp(x);
  FailSlowDetector detector;
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(detector.Push(xs[i++ & 0xffff]));
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
  state.counters["bytes_per_rank"] = static_cast<double>(detector.MemoryBytes());
}
BENCHMARK(BM_DetectorPush);

void BM_FindPeriod(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto period = static_cast<std::size_t>(state.range(1));
  std::vector<std::uint32_t> symbols(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t j = i % period;
    symbols[i] = static_cast<std::uint32_t>((j * 2654435761U) % 97 + (j % 5 == 0 ? 0 : 100));
  }
  std::size_t found = 0;
  for (auto _ : state) {
    const auto r = falcon::analyzer::FindPeriod(symbols);
    found = r.period;
    benchmark::DoNotOptimize(found);
  }
  state.counters["period"] = static_cast<double>(found);
  state.counters["wrong"] = found == period ? 0.0 : 1.0;
}
BENCHMARK(BM_FindPeriod)
    ->Args({100000, 97})
    ->Args({100000, 2400})
    ->Args({100000, 30000})
    ->Unit(benchmark::kMillisecond);

void BM_TrackerMemory(benchmark::State& state) {
  for (auto _ : state) {
    falcon::analyzer::PeriodTracker tracker;
    for (std::uint64_t i = 0; i < 200000; ++i) {
      benchmark::DoNotOptimize(tracker.Push(static_cast<std::uint32_t>(i % 250), i));
    }
    state.counters["tracker_bytes"] = static_cast<double>(tracker.MemoryBytes());
    state.counters["period"] = static_cast<double>(tracker.period());
  }
}
BENCHMARK(BM_TrackerMemory)->Unit(benchmark::kMillisecond)->Iterations(1);

// One call into a locked tracker (the agent's per-record cost): a period of Arg calls, the
// window full, so every push slides the health check's counts. `wrong` = 1 if the lock broke.
void BM_TrackerPushLocked(benchmark::State& state) {
  const auto period = static_cast<std::uint64_t>(state.range(0));
  falcon::analyzer::PeriodTracker tracker;
  std::uint64_t i = 0;
  for (; i < 200000; ++i) (void)tracker.Push(static_cast<std::uint32_t>(i % period), i);
  bool wrong = !tracker.locked() || tracker.period() != period;
  for (auto _ : state) {
    const auto event = tracker.Push(static_cast<std::uint32_t>(i % period), i);
    ++i;
    wrong = wrong || event != falcon::analyzer::TrackerEvent::kNone;
    benchmark::DoNotOptimize(event);
  }
  state.counters["wrong"] = wrong ? 1.0 : 0.0;
}
BENCHMARK(BM_TrackerPushLocked)->Arg(200)->Arg(2400);

}  // namespace

int main(int argc, char** argv) {
#ifdef NDEBUG
  std::printf("# falcon-analyzer-bench 0.1.0 (optimised build)\n");
#else
  std::printf("# falcon-analyzer-bench 0.1.0 -- WARNING: assertions on, unoptimised build?\n");
#endif
  std::printf("# BOCD: hazard 1/250, Normal-Gamma on log time; detector defaults; "
              "period: ACF threshold 0.95\n");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 2;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
