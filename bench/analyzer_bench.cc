// Micro-benchmarks of the analyzer's detection core: BOCD throughput with pruning, the full
// detector per sample, period detection on a 100,000-call window, and memory per tracked rank;
// and the consistent-cut planner at scale (one pipeline communicator counted per channel, side by
// side with two-rank pipeline communicators counted by totals).
// Run: falcon-analyzer-bench [--benchmark_filter=...]. Prints a '#' preamble with the config.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <vector>

#include "analyzer/bocd.h"
#include "analyzer/cut_plan.h"
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

// A TP 8 x PP 8 x DP (ranks / 64) job, 4 micro-batches: per micro-batch a forward (receive,
// 2 TP all-reduces, send) and a backward the other way, then a DP all-reduce. `shared`: every
// stage of a pipeline exchanges on one communicator of all its stages, counted per channel (a
// batched pipeline); else on a two-rank communicator per stage pair, counted by totals. Every
// rank reports from a different point: min_position 1 + rank % 7.
std::vector<falcon::analyzer::RankCallPattern> CutJob(std::int64_t ranks, bool shared) {
  using falcon::analyzer::CallUnit;
  using falcon::analyzer::ChannelKind;
  using falcon::analyzer::PatternComm;
  constexpr std::int64_t kTp = 8, kPp = 8, kMicro = 4;
  const std::int64_t dp = ranks / (kTp * kPp);
  std::vector<falcon::analyzer::RankCallPattern> out;
  for (std::int64_t r = 0; r < ranks; ++r) {
    const std::int64_t t = r % kTp, p = (r / kTp) % kPp, d = r / (kTp * kPp);
    falcon::analyzer::RankCallPattern pat;
    pat.rank = r;
    pat.min_position = 1 + static_cast<std::uint64_t>(r % 7);
    const auto id = [](std::uint64_t kind, std::int64_t a, std::int64_t b) {
      return kind << 56 | static_cast<std::uint64_t>(a) << 28 | static_cast<std::uint64_t>(b);
    };
    pat.comms.push_back({id(1, p, d), kTp, 0, -1, {}});  // 0: TP
    pat.comms.push_back({id(2, t, p), dp, 0, -1, {}});   // 1: DP
    std::uint32_t prev = 0, next = 0;                     // the pipeline exchanges' comm indices
    std::uint32_t send_prev = 0, recv_prev = 0, send_next = 0, recv_next = 0;  // their channels
    if (shared) {
      PatternComm pc{id(3, t, d), kPp, 0, static_cast<std::int32_t>(p), {{ChannelKind::kCollective, -1, 1}}};
      auto channel = [&](ChannelKind kind, std::int64_t peer) {
        pc.channels.push_back({kind, static_cast<std::int32_t>(peer), 0});
        return static_cast<std::uint32_t>(pc.channels.size() - 1);
      };
      if (p > 0) send_prev = channel(ChannelKind::kSend, p - 1), recv_prev = channel(ChannelKind::kRecv, p - 1);
      if (p < kPp - 1) send_next = channel(ChannelKind::kSend, p + 1), recv_next = channel(ChannelKind::kRecv, p + 1);
      pat.comms.push_back(pc);
      prev = next = 2;
    } else {
      if (p > 0) {
        prev = static_cast<std::uint32_t>(pat.comms.size());
        pat.comms.push_back({id(4, t * kPp + p - 1, d), 2, 0, -1, {}});
      }
      if (p < kPp - 1) {
        next = static_cast<std::uint32_t>(pat.comms.size());
        pat.comms.push_back({id(4, t * kPp + p, d), 2, 0, -1, {}});
      }
    }
    auto exchange = [&](std::uint32_t comm, std::uint32_t channel) { pat.units.push_back(CallUnit{true, {{comm, 1, channel}}}); };
    auto tp = [&] { pat.units.push_back(CallUnit{false, {{0, 2, 0}}}); };
    for (std::int64_t m = 0; m < kMicro; ++m) {
      if (p > 0) exchange(prev, recv_prev);
      tp();
      if (p < kPp - 1) exchange(next, send_next);
    }
    for (std::int64_t m = 0; m < kMicro; ++m) {
      if (p < kPp - 1) exchange(next, recv_next);
      tp();
      if (p > 0) exchange(prev, send_prev);
    }
    pat.units.push_back(CallUnit{false, {{1, 1, 0}}});
    out.push_back(std::move(pat));
  }
  return out;
}

// Correctness: where the plan stops them, each stage's sends to its neighbour equal the
// neighbour's receives from it (read per channel or per two-rank communicator alike).
bool CutMatches(const std::vector<falcon::analyzer::RankCallPattern>& job, const falcon::analyzer::CutPlan& plan) {
  if (!plan.ok() || plan.ranks.size() != job.size()) return false;
  std::vector<std::map<std::uint64_t, std::uint64_t>> at(job.size());  // per rank: comm id -> expect_seq
  for (std::size_t i = 0; i < job.size(); ++i) {
    for (const auto& t : plan.ranks[i].targets) at[i][t.comm] = t.expect_seq;
  }
  for (std::size_t i = 0; i < job.size(); ++i) {  // every communicator's members: the same count
    for (const auto& c : job[i].comms) {
      if (!c.channels.empty()) continue;
      for (std::size_t j = 0; j < job.size(); j += 97) {
        const auto it = at[j].find(c.id);
        if (it != at[j].end() && it->second != at[i][c.id]) return false;
      }
    }
  }
  for (std::size_t i = 0; i < job.size(); ++i) {  // shared pipeline communicators: per channel
    for (std::uint32_t c = 0; c < job[i].comms.size(); ++c) {
      const auto& pc = job[i].comms[c];
      for (std::uint32_t k = 0; k < pc.channels.size(); ++k) {
        if (pc.channels[k].kind != falcon::analyzer::ChannelKind::kSend) continue;
        const std::size_t peer = i + static_cast<std::size_t>((pc.channels[k].peer - pc.rank) * 8);  // TP 8
        const auto& qc = job[peer].comms[c];
        for (std::uint32_t q = 0; q < qc.channels.size(); ++q) {
          if (qc.channels[q].kind == falcon::analyzer::ChannelKind::kRecv && qc.channels[q].peer == pc.rank &&
              falcon::analyzer::IssuedOnChannelBefore(job[i], c, k, plan.ranks[i].position) !=
                  falcon::analyzer::IssuedOnChannelBefore(job[peer], c, q, plan.ranks[peer].position)) {
            return false;
          }
        }
      }
    }
  }
  return true;
}

void BM_PlanCut(benchmark::State& state) {
  const std::vector<falcon::analyzer::RankCallPattern> job = CutJob(state.range(0), state.range(1) != 0);
  falcon::analyzer::CutPlan plan;
  for (auto _ : state) {
    plan = falcon::analyzer::PlanCut(job);
    benchmark::DoNotOptimize(plan);
  }
  state.counters["ok"] = CutMatches(job, plan) ? 1 : 0;
}
BENCHMARK(BM_PlanCut)->ArgNames({"ranks", "shared"})->Args({1024, 0})->Args({1024, 1})->Args({4096, 0})
    ->Args({4096, 1})->Args({16384, 0})->Args({16384, 1})->Unit(benchmark::kMillisecond);

// As the controller plans: the lowest rank stops at the start of an iteration, trying two
// (iteration_start_tries 2), then the earliest cut. Every period starts an iteration, and the
// last rank reports a period later than the others, so the first iteration has no cut and the
// second does. `stopped_at_iteration` must be 1: the cut the controller wants was found.
void BM_PlanCutAtIteration(benchmark::State& state) {
  std::vector<falcon::analyzer::RankCallPattern> job = CutJob(state.range(0), state.range(1) != 0);
  for (auto& p : job) p.iteration_at_start = 0;
  job.back().min_position += job.back().units.size();
  falcon::analyzer::CutOptions options;
  options.iteration_start_tries = 2;
  falcon::analyzer::CutPlan plan;
  for (auto _ : state) {
    plan = falcon::analyzer::PlanCut(job, options);
    benchmark::DoNotOptimize(plan);
  }
  state.counters["ok"] = CutMatches(job, plan) ? 1 : 0;
  const std::uint64_t units = job.front().units.size();
  state.counters["stopped_at_iteration"] =
      plan.ok() && plan.ranks.front().position % units == 0 && plan.ranks.front().position / units == 2 ? 1 : 0;
}
BENCHMARK(BM_PlanCutAtIteration)->ArgNames({"ranks", "shared"})->Args({4096, 0})->Args({4096, 1})
    ->Args({16384, 0})->Args({16384, 1})->Unit(benchmark::kMillisecond);

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
