// falcon-pipeline-bench: the pipeline-adaptation analyzer (analyzer/pipeline_schedule.h,
// analyzer/pipeline_plan.h) measured two ways.
//  1. Cost: building the schedule for S = 16 stages and N = 128 micro-batches (target < 10 ms),
//     simulating it, adapting warm-up counts to a slow link (the whole planner, with its
//     simulations) and initial planning; wall time per call, p50 / p95 / p99 over repetitions.
//  2. Benefit: a sweep over S = 4, 8, 16 (N = 4 S, F = 1, B = 2, backward fused) with one slow
//     link in the middle of the pipeline delayed 0.5-8 x a micro-batch's forward time: the
//     simulated iteration time of standard 1F1B against the adapted plan, under an activation
//     limit of 2 S micro-batches per stage.
// A row is wrong when its schedule fails ValidatePipelineSchedule, the simulator disagrees with
// the planner, the plan is slower than 1F1B or a stage holds more activations than its limit.
// Run: falcon-pipeline-bench [--reps N] [--json]. Exit status 1 on a wrong row.
#include <sys/utsname.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "analyzer/pipeline_plan.h"
#include "analyzer/pipeline_schedule.h"

namespace {

namespace fa = falcon::analyzer;

struct Options {
  int reps = 21;
  bool json = false;
  double target_ms = 10;
};

struct CostRow {
  std::string what;
  int stages = 0;
  int microbatches = 0;
  double p50_ms = 0, p95_ms = 0, p99_ms = 0;
  int wrong = 0;
};

struct SweepRow {
  int stages = 0;
  int microbatches = 0;
  int link = 0;
  double delay = 0;    // in forward times
  double healthy = 0;  // 1F1B without the delay
  double one_f_one_b = 0;
  double adapted = 0;
  double tolerance = 0;  // of the slow link under the plan
  int slackness = 0;     // of the slow link under the plan
  int peak = 0;          // most activations any stage holds under the plan
  int wrong = 0;
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

fa::PipelineModel Model(int stages, int slow_link, double delay) {
  fa::PipelineModel m;
  m.stages.assign(static_cast<std::size_t>(stages), fa::StageTimes{1.0, 2.0, 0.0});
  m.link_delay_s.assign(static_cast<std::size_t>(stages - 1), 0.0);
  if (slow_link >= 0) m.link_delay_s[static_cast<std::size_t>(slow_link)] = delay;
  return m;
}

// Wall time of `call` per repetition; a repetition is wrong when `call` fails, the row when
// `check` (run once afterwards, untimed) fails.
CostRow Time(const std::string& what, int stages, int n, int reps,
             const std::function<bool()>& call, const std::function<bool()>& check) {
  CostRow row{what, stages, n};
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool right = call();
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    row.wrong += right ? 0 : 1;
  }
  row.wrong += check() ? 0 : 1;
  row.p50_ms = Percentile(ms, 50);
  row.p95_ms = Percentile(ms, 95);
  row.p99_ms = Percentile(ms, 99);
  return row;
}

std::vector<CostRow> CostRows(const Options& o) {
  constexpr int kStages = 16, kN = 128;
  const fa::PipelineModel calm = Model(kStages, -1, 0);
  const fa::PipelineModel slow = Model(kStages, kStages / 2 - 1, 4.0);
  const std::vector<std::int32_t> standard = fa::StandardWarmup(kStages, kN).value();
  fa::PipelineAdaptRequest request;
  request.model = slow;
  request.microbatches = kN;
  request.activation_limit.assign(kStages, 2 * kStages);
  const std::vector<std::int32_t> adapted = fa::AdaptPipeline(request).value().warmup;
  const fa::PipelineModel split = [&] {
    fa::PipelineModel m = slow;
    m.backward = fa::BackwardMode::kSplit;
    m.stages.assign(kStages, fa::StageTimes{1.0, 1.2, 0.8});
    return m;
  }();
  const fa::PipelineSchedule sched = fa::BuildPipelineSchedule(slow, adapted, kN).value();

  std::vector<CostRow> rows;
  for (const auto& [what, model, x] :
       {std::tuple{"build 1F1B", &calm, &standard}, std::tuple{"build adapted", &slow, &adapted},
        std::tuple{"build adapted F/B/W", &split, &adapted}}) {
    falcon::Result<fa::PipelineSchedule> last = falcon::Status::Internal("not run");
    rows.push_back(Time(
        what, kStages, kN, o.reps,
        [&, model = model, x = x] {
          last = fa::BuildPipelineSchedule(*model, *x, kN);
          return last.ok();
        },
        [&, model = model] {
          return last.ok() && fa::ValidatePipelineSchedule(last.value(), model->backward).ok();
        }));
  }
  falcon::Result<fa::PipelineSimulation> sim = falcon::Status::Internal("not run");
  rows.push_back(Time(
      "simulate adapted", kStages, kN, o.reps,
      [&] {
        sim = fa::SimulatePipeline(slow, sched);
        return sim.ok();
      },
      [&] {
        return sim.ok() &&
               sim.value().iteration_s == fa::WarmupIterationTime(slow, adapted, kN).value();
      }));
  falcon::Result<fa::PipelinePlan> plan = falcon::Status::Internal("not run");
  rows.push_back(Time(
      "adapt (plan + search)", kStages, kN, o.reps,
      [&] {
        plan = fa::AdaptPipeline(request);
        return plan.ok();
      },
      [&] {
        return plan.ok() && plan.value().iteration_s < plan.value().baseline_iteration_s &&
               plan.value().warmup == adapted;
      }));
  rows.push_back(Time(
      "initial plan", kStages, kN, o.reps,
      [&] { return fa::PlanInitialWarmup(request.activation_limit, kN).ok(); },
      [&] { return true; }));
  return rows;
}

// One sweep case, checked: the plan's schedule is valid, holds no more than the limit, and its
// simulated time is the planner's and no worse than 1F1B's.
SweepRow Sweep(int stages, double delay) {
  SweepRow row;
  row.stages = stages;
  row.microbatches = 4 * stages;
  row.link = stages / 2 - 1;
  row.delay = delay;
  const int n = row.microbatches;
  const std::vector<std::int32_t> standard = fa::StandardWarmup(stages, n).value();
  row.healthy = fa::WarmupIterationTime(Model(stages, -1, 0), standard, n).value();
  fa::PipelineAdaptRequest r;
  r.model = Model(stages, row.link, delay);
  r.microbatches = n;
  r.activation_limit.assign(static_cast<std::size_t>(stages), 2 * stages);
  const auto plan = fa::AdaptPipeline(r);
  const auto sched =
      plan.ok() ? fa::BuildPipelineSchedule(r.model, plan.value().warmup, n) : plan.status();
  const auto sim = sched.ok() ? fa::SimulatePipeline(r.model, sched.value()) : sched.status();
  if (!sim.ok() || !fa::ValidatePipelineSchedule(sched.value(), r.model.backward).ok()) {
    row.wrong = 1;
    return row;
  }
  const fa::PipelinePlan& p = plan.value();
  row.one_f_one_b = fa::WarmupIterationTime(r.model, standard, n).value();
  row.adapted = sim.value().iteration_s;
  const auto link = static_cast<std::size_t>(row.link);
  row.slackness = p.warmup[link] - p.warmup[link + 1];
  row.tolerance = fa::LinkDelayTolerance(r.model, p.warmup).value()[link];
  for (std::size_t s = 0; s < sim.value().stages.size(); ++s) {
    const int held = sim.value().stages[s].peak_activations;
    row.peak = std::max(row.peak, held);
    if (held > r.activation_limit[s]) row.wrong = 1;
  }
  if (row.adapted != p.iteration_s || row.adapted > row.one_f_one_b * (1 + 1e-12)) row.wrong = 1;
  return row;
}

double Removed(const SweepRow& r) {
  const double slowdown = r.one_f_one_b - r.healthy;
  return slowdown > 0 ? 100.0 * (r.one_f_one_b - r.adapted) / slowdown : 0.0;
}

void PrintJson(const Options& o, const std::vector<CostRow>& cost,
               const std::vector<SweepRow>& sweep, bool pass) {
  std::printf("{\"schema\": 1, \"bench\": \"falcon-pipeline-bench\", \"reps\": %d, \"cost\": [",
              o.reps);
  for (std::size_t i = 0; i < cost.size(); ++i) {
    const CostRow& c = cost[i];
    std::printf(
        "%s{\"what\": \"%s\", \"stages\": %d, \"microbatches\": %d, \"p50_ms\": %.4f, "
        "\"p95_ms\": %.4f, \"p99_ms\": %.4f, \"wrong\": %d}",
        i ? ", " : "", c.what.c_str(), c.stages, c.microbatches, c.p50_ms, c.p95_ms, c.p99_ms,
        c.wrong);
  }
  std::printf("], \"sweep\": [");
  for (std::size_t i = 0; i < sweep.size(); ++i) {
    const SweepRow& r = sweep[i];
    std::printf(
        "%s{\"stages\": %d, \"microbatches\": %d, \"link\": %d, \"delay_f\": %.2f, "
        "\"healthy\": %.3f, \"one_f_one_b\": %.3f, \"adapted\": %.3f, "
        "\"slackness\": %d, \"tolerance\": %.3f, \"peak\": %d, \"wrong\": %d}",
        i ? ", " : "", r.stages, r.microbatches, r.link, r.delay, r.healthy, r.one_f_one_b,
        r.adapted, r.slackness, r.tolerance, r.peak, r.wrong);
  }
  std::printf("], \"target_ms\": %.1f, \"pass\": %s}\n", o.target_ms, pass ? "true" : "false");
}

void PrintTables(const std::vector<CostRow>& cost, const std::vector<SweepRow>& sweep) {
  std::printf("%-22s %4s %5s %10s %10s %10s %7s\n", "call", "S", "N", "p50_ms", "p95_ms", "p99_ms",
              "#wrong");
  for (const CostRow& c : cost) {
    std::printf("%-22s %4d %5d %10.3f %10.3f %10.3f %7d\n", c.what.c_str(), c.stages,
                c.microbatches, c.p50_ms, c.p95_ms, c.p99_ms, c.wrong);
  }
  std::printf(
      "# sweep: iteration time in units of F (F = 1, B = 2, healthy stage period 3); "
      "limit %s\n",
      "2 S activations per stage");
  std::printf("%4s %5s %4s %8s %9s %9s %9s %7s %8s %5s %10s %5s %7s\n", "S", "N", "link", "delay/F",
              "healthy", "1F1B", "adapted", "gain", "removed", "D", "tolerance", "peak", "#wrong");
  for (const SweepRow& r : sweep) {
    std::printf("%4d %5d %4d %8.2f %9.2f %9.2f %9.2f %6.2fx %7.1f%% %5d %10.2f %5d %7d\n", r.stages,
                r.microbatches, r.link, r.delay, r.healthy, r.one_f_one_b, r.adapted,
                r.adapted > 0 ? r.one_f_one_b / r.adapted : 0.0, Removed(r), r.slackness,
                r.tolerance, r.peak, r.wrong);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      o.json = true;
    } else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      o.reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--reps N] [--json]\n", argv[0]);
      return 2;
    }
  }
  const std::vector<CostRow> cost = CostRows(o);
  std::vector<SweepRow> sweep;
  for (const int stages : {4, 8, 16}) {
    for (const double delay : {0.5, 1.0, 2.0, 4.0, 8.0}) sweep.push_back(Sweep(stages, delay));
  }
  int wrong = 0;
  for (const CostRow& c : cost) wrong += c.wrong;
  for (const SweepRow& r : sweep) wrong += r.wrong;
  const double build_p50 = cost[1].p50_ms;  // "build adapted", S 16, N 128
  const bool pass = wrong == 0 && build_p50 < o.target_ms;
  if (o.json) {
    PrintJson(o, cost, sweep, pass);
    return wrong != 0 ? 1 : 0;
  }
#ifdef NDEBUG
  const char* build = "optimised";
#else
  const char* build = "assertions on -- WARNING: unoptimised build?";
#endif
  utsname u;
  uname(&u);
  std::printf("# falcon-pipeline-bench 0.1.0 (%s build)\n", build);
  std::printf("# machine: %s, %u cores, %s %s\n", CpuModel().c_str(),
              std::thread::hardware_concurrency(), u.sysname, u.release);
  std::printf(
      "# cost: S 16, N 128, F 1, B 2 (F/B/W: 1, 1.2, 0.8), link 7 delayed 4 F, limit 32 "
      "activations per stage; %d repetitions, wall time per call\n",
      o.reps);
  PrintTables(cost, sweep);
  std::vector<double> removed;
  for (const SweepRow& r : sweep) removed.push_back(Removed(r));
  std::printf("# slowdown removed over the sweep: p50 %.1f%%, p95 %.1f%%, p99 %.1f%%\n",
              Percentile(removed, 50), Percentile(removed, 95), Percentile(removed, 99));
  std::printf(
      "# verdict: schedule build (adapted, S 16, N 128) p50 %.3f ms, target < %.0f ms; "
      "%d wrong: %s\n",
      build_p50, o.target_ms, wrong, pass ? "PASS" : "FAIL");
  return wrong != 0 ? 1 : 0;
}
