// Micro-benchmarks of what the controller's loop does every turn for a large job, each beside
// the way it was done before, in one run:
//  - the job's iteration time (TrackingStage::CurrentIterationS), kept as reports arrive, against
//    the scan of every rank's recent samples it replaced;
//  - the live slow ranks (TrackingStage::LiveSlow), kept until an alarm or a view update, against
//    the scan of every slow rank;
//  - a state write's text, the slow ranks written apart (only when an alarm changes them),
//    against the document that held them.
// Jobs of 4,096 and 16,384 ranks, every rank slow (an outbreak: the case that costs most). Each
// row reports `wrong` = 1 when its answer differs from the recomputation's (the iteration time,
// the slow ranks, the document read back).
// Run: falcon-controller-bench [--benchmark_filter=...].
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "daemon/controller/controller_state.h"
#include "daemon/controller/job_view.h"
#include "daemon/controller/tracking_stage.h"
#include "daemon/protocol/messages.h"
#include "daemon/protocol/validate.h"

namespace {

namespace fc = falcon::controller;
namespace fp = falcon::protocol;
using nlohmann::json;

constexpr std::int64_t kT0 = 1'795'264'878'000'000'000;

json Validated(const json& m, const fp::MessageSpec& spec) {
  auto r = fp::ParseMessage(m.dump(), spec);
  return r.ok() ? std::move(r).value() : json::object();
}

// A job of n ranks (TP 8 groups and a world communicator, 8 ranks a node), one view update.
fc::JobView View(std::int64_t n) {
  std::vector<json> ranks, agents;
  for (std::int64_t r = 0; r < n; ++r) {
    fp::RankRegistration m;
    m.header = {"job", "node" + std::to_string(r / 8), kT0};
    m.rank = r;
    m.pid = 1000 + r;
    m.started_ns = kT0 - 1;
    const auto rank = static_cast<std::int32_t>(r);
    m.comms = {{0xabcdeULL, rank, static_cast<std::int32_t>(n), "world", 100},
               {0x7b0b0000ULL + static_cast<std::uint64_t>(r / 8), rank % 8, 8, "tp", 100}};
    ranks.push_back(Validated(fp::ToJson(m), fp::kRankRegister));
  }
  for (std::int64_t node = 0; node < n / 8; ++node) {
    fp::AgentHeartbeat h;
    h.header = {"job", "node" + std::to_string(node), kT0};
    h.pid = 42;
    h.version = "0.1.0";
    agents.push_back(Validated(fp::ToJson(h), fp::kAgentHeartbeat));
  }
  fc::JobView v;
  v.Update(ranks, agents);
  return v;
}

json Iterations(std::int64_t rank, double seconds) {
  fp::IterationBatch m;
  m.header = {"job", "node" + std::to_string(rank / 8), kT0};
  m.rank = rank;
  m.pid = 1000 + rank;
  m.period = 9;
  m.start_ns = {kT0};
  m.seconds = {seconds};
  return Validated(fp::ToJson(m), fp::kIterations);
}

json Alarm(std::int64_t rank) {
  fp::AlarmReport m;
  m.header = {"job", "node" + std::to_string(rank / 8), kT0};
  m.rank = rank;
  m.pid = 1000 + rank;
  m.kind = "slow";
  m.onset = 10;
  m.at = 20;
  m.ratio = 1.8;
  m.level_s = 1.8;
  m.baseline_s = 1.0;
  m.onset_ns = kT0;
  return Validated(fp::ToJson(m), fp::kAlarm);
}

// n ranks with eight iterations each and every rank slow, as the tracking stage holds them.
struct Job {
  std::map<std::int64_t, fc::SlowRank> slow;
  fc::TrackingStage tracking{slow};
  std::map<std::int64_t, std::deque<double>> samples;  // for the recomputation
  fc::JobView view;
  explicit Job(std::int64_t n) : view(View(n)) {
    for (std::int64_t r = 0; r < n; ++r) {
      for (int i = 0; i < 8; ++i) {
        const double s = 1.0 + 0.001 * static_cast<double>((r * 7 + i * 13) % 97);
        tracking.OnIterations(Iterations(r, s));
        samples[r].push_back(s);
      }
      (void)tracking.OnAlarm(Alarm(r));
    }
  }
};

// The scan the kept iteration time replaced: every rank's median of its last 8, the worst live one.
std::optional<double> ScanIterationS(const Job& j) {
  std::optional<double> worst;
  std::vector<double> v;
  for (const auto& [rank, q] : j.samples) {
    if (q.empty() || !j.view.ranks().count(rank)) continue;
    v.assign(q.end() - static_cast<std::ptrdiff_t>(std::min<std::size_t>(8, q.size())), q.end());
    std::sort(v.begin(), v.end());
    const std::size_t k = v.size();
    const double m = k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
    if (!worst || m > *worst) worst = m;
  }
  return worst;
}

std::vector<std::int64_t> ScanLiveSlow(const Job& j) {
  std::vector<std::int64_t> out;
  for (const auto& [rank, s] : j.slow) {
    if (j.view.ranks().count(rank)) out.push_back(rank);
  }
  return out;
}

void BM_IterationTime(benchmark::State& state) {
  const Job j(state.range(0));
  const bool kept = state.range(1) == 1;
  std::optional<double> got;
  for (auto _ : state) {
    got = kept ? j.tracking.CurrentIterationS(j.view) : ScanIterationS(j);
    benchmark::DoNotOptimize(got);
  }
  state.counters["wrong"] = got == ScanIterationS(j) && got.has_value() ? 0.0 : 1.0;
}
BENCHMARK(BM_IterationTime)->ArgNames({"ranks", "kept"})->Args({4096, 0})->Args({4096, 1})->Args({16384, 0})
    ->Args({16384, 1})->Unit(benchmark::kMicrosecond);

void BM_LiveSlow(benchmark::State& state) {
  const Job j(state.range(0));
  const bool kept = state.range(1) == 1;
  std::size_t got = 0;
  for (auto _ : state) {
    got = kept ? j.tracking.LiveSlow(j.view).size() : ScanLiveSlow(j).size();
    benchmark::DoNotOptimize(got);
  }
  state.counters["wrong"] = j.tracking.LiveSlow(j.view) == ScanLiveSlow(j) &&
                                    got == static_cast<std::size_t>(state.range(0))
                                ? 0.0
                                : 1.0;
}
BENCHMARK(BM_LiveSlow)->ArgNames({"ranks", "kept"})->Args({4096, 0})->Args({4096, 1})->Args({16384, 0})
    ->Args({16384, 1})->Unit(benchmark::kMicrosecond);

// The state document of an outbreak: every rank slow, an incident listing them all.
fc::ControllerState Outbreak(std::int64_t n) {
  fc::ControllerState s;
  s.phase = fc::Phase::kTracking;
  s.since_ns = kT0;
  s.incidents = 1;
  s.cursors = {{"iterations", "1795264878000-0"}, {"alarms", "1795264878000-1"}};
  for (std::int64_t r = 0; r < n; ++r) s.slow[r] = {1.8 + 1e-6 * static_cast<double>(r), 1.8, 1.0, kT0 + r};
  fc::Incident inc;
  inc.id = "inc-1795264878000-1";
  inc.opened_ns = kT0;
  for (std::int64_t r = 0; r < n; ++r) inc.ranks.push_back(r);
  inc.healthy_s = 1.0;
  s.incident = inc;
  s.healthy_s = 1.0;
  return s;
}

// A state write's text during an outbreak: the document with the slow ranks in it (as before
// they moved to the hash's own field) against the document without them, the field being written
// only when an alarm changes them. `wrong`: the document read back, with the field, is not the
// whole state.
void BM_StateDocument(benchmark::State& state) {
  const fc::ControllerState s = Outbreak(state.range(0));
  const bool apart = state.range(1) == 1;
  std::string text;
  for (auto _ : state) {
    text = fc::ToJson(s, /*with_slow=*/!apart).dump();
    benchmark::DoNotOptimize(text);
  }
  std::string why;
  fc::ControllerState back = fc::StateFromJson(json::parse(text), &why);
  if (apart) back.slow = fc::SlowFromJson(json::parse(fc::SlowJson(s.slow).dump()));
  state.counters["wrong"] = why.empty() && fc::ToJson(back) == fc::ToJson(s) ? 0.0 : 1.0;
  state.counters["MB"] = static_cast<double>(text.size()) / 1e6;
}
BENCHMARK(BM_StateDocument)->ArgNames({"ranks", "apart"})->Args({4096, 0})->Args({4096, 1})->Args({16384, 0})
    ->Args({16384, 1})->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
