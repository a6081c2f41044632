// Micro-benchmarks of the mitigation planners: the exact S2 micro-batch solver at 512, 10,000
// and 100,000 DP groups (targets: < 1 ms at 512, < 100 ms at 100,000), the S3 planners (link
// relief, straggler consolidation) on Megatron-placed jobs of 1,024 and 16,384 GPUs (tp 8 x pp 8)
// and of 2,048 DP replicas (tp 8 x dp 2,048, 16,384 GPUs), and the S4 restart planner on jobs of
// 2,048 and 4,096 nodes.
// Each row reports `wrong` = 1 when the answer fails its check (S2: not optimal by the O(n)
// certificate IsOptimalMicrobatchAllocation; S3: the congested link still carries DP traffic,
// or stragglers not consolidated; S4: a faulty node in the restarted job, or a shape that does
// not fill its nodes).
// Run: falcon-mitigation-bench [--benchmark_filter=...]. Prints a '#' preamble with the config.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "analyzer/microbatch_plan.h"
#include "analyzer/restart_plan.h"
#include "analyzer/topology_plan.h"

namespace {

namespace fa = falcon::analyzer;

std::vector<double> Times(std::size_t n, std::uint64_t seed) {
  std::vector<double> out(n);
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (double& t : out) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    t = 0.1 + 0.02 * static_cast<double>(s >> 11) * 0x1.0p-53;  // healthy 100-120 ms
  }
  for (std::size_t i = 0; i < n; i += 97) out[i] *= 2.5;  // ~1 % stragglers
  return out;
}

void BM_MicrobatchPlan(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<double> times = Times(n, 1);
  const auto total = static_cast<std::int64_t>(8 * n);
  double bottleneck = 0;
  for (auto _ : state) {
    const auto plan = fa::PlanMicrobatches(times, total);
    // DoNotOptimize on the Result, not on a double: GCC miscompiles the "+m,r" constraint of
    // libbenchmark 1.7's DoNotOptimize(double&) and the double reads back as garbage.
    benchmark::DoNotOptimize(plan);
    bottleneck = plan.value().bottleneck_after_s;
  }
  // The solver is deterministic: the plan made again here is the one timed above.
  const fa::MicrobatchPlan plan = fa::PlanMicrobatches(times, total).value();
  const auto optimal = fa::IsOptimalMicrobatchAllocation(times, total, plan.microbatches);
  const bool right = optimal.ok() && optimal.value() && plan.bottleneck_after_s == bottleneck;
  state.counters["wrong"] = right ? 0.0 : 1.0;
  state.counters["speedup"] = plan.bottleneck_before_s / bottleneck;
}
BENCHMARK(BM_MicrobatchPlan)->Arg(512)->Arg(10000)->Arg(100000)->Unit(benchmark::kMicrosecond);

// tp 8 x dp x pp on 8-GPU nodes, Megatron order: a node holds one TP group.
fa::JobPlacement Job(std::int32_t dp, std::int32_t pp) {
  fa::JobPlacement p;
  p.shape = {8, dp, pp};
  p.gpus_per_node = 8;
  p.num_nodes = dp * pp;
  for (std::int32_t r = 0; r < 8 * dp * pp; ++r) p.node_of_rank.push_back(r / 8);
  return p;
}

fa::JobPlacement Job(const benchmark::State& state) {
  return Job(static_cast<std::int32_t>(state.range(0)), static_cast<std::int32_t>(state.range(1)));
}

void BM_LinkRelief(benchmark::State& state) {
  const fa::JobPlacement job = Job(state);
  bool wrong = false;
  for (auto _ : state) {
    const auto plan = fa::PlanLinkRelief(job, {}, {0, 1});  // stage 0, DP neighbours
    wrong = !plan.ok() || plan.value().link_after.traffic >= fa::LinkTraffic::kData;
    benchmark::DoNotOptimize(plan);
  }
  state.counters["gpus"] = static_cast<double>(job.node_of_rank.size());
  state.counters["wrong"] = wrong ? 1.0 : 0.0;
}
BENCHMARK(BM_LinkRelief)->ArgNames({"dp", "pp"})->Args({16, 8})->Args({256, 8})->Args({2048, 1})
    ->Unit(benchmark::kMillisecond);

void BM_StragglerConsolidation(benchmark::State& state) {
  const fa::JobPlacement job = Job(state);
  std::vector<fa::GpuId> stragglers;
  for (std::int32_t n = 0; n < job.num_nodes; n += job.num_nodes / 8) stragglers.push_back({n, 3});
  bool wrong = false;
  for (auto _ : state) {
    const auto plan = fa::PlanStragglerConsolidation(job, {}, stragglers);
    // Consolidated: the slow GPUs end in as few pipeline stages as can hold them (one).
    wrong = !plan.ok() || plan.value().straggler_stages_after.size() != 1;
    benchmark::DoNotOptimize(plan);
  }
  state.counters["gpus"] = static_cast<double>(job.node_of_rank.size());
  state.counters["wrong"] = wrong ? 1.0 : 0.0;
}
BENCHMARK(BM_StragglerConsolidation)->ArgNames({"dp", "pp"})->Args({16, 8})->Args({256, 8})->Args({2048, 1})
    ->Unit(benchmark::kMillisecond);

// S4 on a tp 8 x pp 8 job of Arg nodes (dp = nodes / 8): 1 % of its nodes faulty, 4 spares, so
// the job shrinks its DP degree.
void BM_RestartPlan(benchmark::State& state) {
  const auto nodes = static_cast<std::int32_t>(state.range(0));
  fa::RestartRequest req;
  req.tp = 8;
  req.pp = 8;
  req.dp = nodes / 8;
  req.gpus_per_node = 8;
  for (std::int32_t n = 0; n < nodes; ++n) req.job_nodes.push_back(n);
  for (std::int32_t n = 0; n < nodes; n += 100) req.faulty_nodes.push_back(n);
  for (std::int32_t n = 0; n < 4; ++n) req.spare_nodes.push_back(nodes + n);
  bool wrong = false;
  for (auto _ : state) {
    const auto plan = fa::PlanRestart(req);
    wrong = !plan.ok() || plan.value().kind != fa::RestartKind::kShrinkDataParallel ||
            plan.value().world_size > static_cast<std::int64_t>(plan.value().nodes.size()) * 8;
    if (!wrong) {
      for (std::int32_t n : plan.value().nodes) wrong = wrong || (n % 100 == 0 && n < nodes);
    }
    benchmark::DoNotOptimize(plan);
  }
  state.counters["gpus"] = static_cast<double>(nodes) * 8;
  state.counters["wrong"] = wrong ? 1.0 : 0.0;
}
BENCHMARK(BM_RestartPlan)->Arg(2048)->Arg(4096)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
#ifdef NDEBUG
  std::printf("# falcon-mitigation-bench 0.1.0 (optimised build)\n");
#else
  std::printf("# falcon-mitigation-bench 0.1.0 -- WARNING: assertions on, unoptimised build?\n");
#endif
  std::printf(
      "# S2: M = 8 x groups micro-batches, times 100-120 ms, every 97th group 2.5x slower\n"
      "# S3: tp 8 x dp x pp on 8-GPU nodes, default JobCostModel; relief of "
      "link 0-1 (DP); consolidation of 8 slow GPUs, one per stage\n"
      "# S4: tp 8 x pp 8 on Arg nodes, every 100th node faulty, 4 spares (DP shrinks)\n");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 2;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
