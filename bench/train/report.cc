// Ground-truth report; see report.h.
#include "report.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

namespace falcon::train {
namespace {

using nlohmann::json;

// Quantile q of sorted values, nearest-rank with linear interpolation.
double Quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

json FaultJson(const AffectingFault& f) {
  return {{"index", f.index}, {"kind", emu::FaultKindName(f.fault.kind)}, {"scope", f.scope},
          {"ranks", f.fault.ranks}, {"nodes", f.fault.nodes}, {"start_s", f.fault.start_s},
          {"duration_s", f.fault.duration_s}, {"factor", f.fault.factor}};
}

json ConfigJson(const Options& o) {
  return {{"micro_batches", o.micro_batches}, {"layers", o.layers}, {"hidden", o.hidden}, {"seq", o.seq},
          {"micro_batch_size", o.micro_batch_size}, {"compute_ms", o.compute_ms},
          {"optimizer_ms", o.optimizer_ms}, {"dp_mode", DpModeName(o.dp_mode)}, {"check", o.check},
          {"activation_bytes", o.ActivationBytes()}, {"grad_bytes", o.GradBytes()},
          {"iters", o.iters}, {"duration_s", o.duration_s}, {"plan_file", o.plan_file},
          {"plan_source", o.falcon_plans ? "falcon" : (o.plan_file.empty() ? "none" : "file")},
          {"checkpoint_every", o.checkpoint_every}, {"restart_s", o.restart_s}, {"spare_nodes", o.spare_nodes},
          {"state_bytes", o.StateBytes()}, {"mode", o.world_sync ? "world-sync" : "megatron"},
          {"lazy_init", o.lazy_init}, {"nonblocking", o.nonblocking}, {"watchdog", o.watchdog && !o.world_sync},
          {"checkpoint_save_ms", o.checkpoint_save_ms},
          {"pp_comm", o.pp_per_direction ? "per-direction" : "batched"}, {"activation_limit", o.ActivationLimit()},
          {"split_backward", o.split_backward}};
}

json PlanJson(const PlanRecord& p) {
  return {{"version", p.version}, {"strategy", p.strategy}, {"source", p.source}, {"status", p.status},
          {"reason", p.reason}, {"iter", p.iter}, {"at_s", p.at_s}, {"cost_s", p.cost_s},
          {"modelled_s", p.modelled_s}, {"micro_batches", p.micro_batches}, {"placement", p.placement},
          {"exclude_nodes", p.exclude_nodes}, {"restart", p.restart}, {"moved_ranks", p.moved_ranks},
          {"moved_bytes", p.moved_bytes}, {"warmup", p.warmup}, {"warmup_changed", p.warmup_changed}};
}

json RestartJson(const RestartRecord& r) {
  return {{"version", r.version}, {"at_s", r.at_s}, {"next_iter", r.next_iter}, {"rollback_to", r.rollback_to},
          {"lost_iterations", r.lost_iterations}, {"lost_s", r.lost_s}, {"restart_s", r.restart_s},
          {"cost_s", r.cost_s}, {"exclude_nodes", r.exclude_nodes}};
}

json SummaryJson(const ReportData& r) {
  const Summary s = Summarize(r.iterations);
  int applied = 0, rejected = 0, lost = 0;
  double cost = 0;
  for (const PlanRecord& p : r.plans) {
    (p.status == "applied" ? applied : rejected) += 1;
    cost += p.cost_s;
  }
  for (const RestartRecord& x : r.restarts) lost += x.lost_iterations;
  return {{"iterations", s.iterations}, {"median_s", s.median_s}, {"mean_s", s.mean_s}, {"min_s", s.min_s},
          {"max_s", s.max_s}, {"p95_s", s.p95_s}, {"total_s", s.total_s}, {"plans_applied", applied},
          {"plans_rejected", rejected}, {"restarts", r.restarts.size()}, {"lost_iterations", lost},
          {"mitigation_cost_s", cost}};
}

}  // namespace

std::vector<AffectingFault> FaultsAffecting(const emu::FaultPlan& plan, int rank, const std::vector<int>& nodes) {
  std::vector<AffectingFault> out;
  for (std::size_t i = 0; i < plan.faults().size(); ++i) {
    const emu::Fault& f = plan.faults()[i];
    const auto has = [](const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); };
    std::string scope;
    if ((f.kind == emu::FaultKind::kCompute || f.kind == emu::FaultKind::kHang) && has(f.ranks, rank)) scope = "rank";
    if (f.kind == emu::FaultKind::kLink || f.kind == emu::FaultKind::kNic) {
      for (int node : nodes) {
        if (has(f.nodes, node)) scope = "node";
      }
    }
    if (!scope.empty()) out.push_back({static_cast<int>(i), f, scope});
  }
  return out;
}

Summary Summarize(const std::vector<IterationRecord>& iterations) {
  Summary s;
  s.iterations = static_cast<int>(iterations.size());
  if (iterations.empty()) return s;
  std::vector<double> d;
  for (const IterationRecord& r : iterations) d.push_back(r.duration_s);
  std::sort(d.begin(), d.end());
  for (double x : d) s.total_s += x;
  s.mean_s = s.total_s / static_cast<double>(d.size());
  s.min_s = d.front();
  s.max_s = d.back();
  s.median_s = Quantile(d, 0.5);
  s.p95_s = Quantile(d, 0.95);
  return s;
}

std::string ReportJson(const ReportData& r, int indent) {
  json iters = json::array();
  for (const IterationRecord& it : r.iterations) {
    iters.push_back({{"iter", it.iter}, {"start_s", it.start_s}, {"duration_s", it.duration_s},
                     {"micro_batches", it.micro_batches}, {"plan_version", it.plan_version},
                     {"compute_factor", it.compute_factor}, {"node", it.node}, {"redo", it.redo},
                     {"warmup", it.warmup}});
  }
  json changes = json::array();
  for (const PlanChange& c : r.plan_changes) {
    changes.push_back({{"iter", c.iter}, {"version", c.version}, {"micro_batches", c.micro_batches}});
  }
  json faults = json::array();
  for (const AffectingFault& f : r.faults) faults.push_back(FaultJson(f));
  json plans = json::array();
  for (const PlanRecord& p : r.plans) plans.push_back(PlanJson(p));
  json restarts = json::array();
  for (const RestartRecord& x : r.restarts) restarts.push_back(RestartJson(x));
  const json j = {
      {"schema", "falcon.train.report"}, {"schema_version", kReportSchemaVersion}, {"status", r.status},
      {"rank", r.rank}, {"world_size", r.world_size}, {"pid", r.pid}, {"node", r.node},
      {"launch_node", r.launch_node},
      {"shape", {{"tp", r.options.shape.tp}, {"dp", r.options.shape.dp}, {"pp", r.options.shape.pp}}},
      {"coords", {{"tp", r.coords.tp}, {"dp", r.coords.dp}, {"pp", r.coords.pp}}},
      {"config", ConfigJson(r.options)}, {"iterations", iters}, {"plan_changes", changes}, {"plans", plans},
      {"restarts", restarts},
      {"checkpoints", {{"every", r.checkpoints.every}, {"taken", r.checkpoints.taken},
                       {"last_iter", r.checkpoints.last_iter}}},
      {"faults", faults},
      {"runtime", {{"comm_groups", r.comm_groups}, {"world_splits", r.world_splits},
                   {"watchdog_polls", r.watchdog_polls}, {"device_streams", r.device_streams},
                   {"device_compute", r.device_compute}, {"peak_activations", r.peak_activations},
                   {"schedule", r.schedule}}},
      {"summary", SummaryJson(r)}};
  // Strings here are ours or come from UTF-8 clean messages; replace keeps dump() exception-free.
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

std::string ReportPath(const std::string& spec, int rank, int world) {
  if (spec == "-") return spec;
  const std::string token = "{rank}";
  if (const auto pos = spec.find(token); pos != std::string::npos) {
    return spec.substr(0, pos) + std::to_string(rank) + spec.substr(pos + token.size());
  }
  return world > 1 ? spec + ".rank" + std::to_string(rank) : spec;
}

Status WriteReport(const std::string& spec, const ReportData& data) {
  const std::string path = ReportPath(spec, data.rank, data.world_size);
  if (path == "-") {
    std::printf("%s\n", ReportJson(data, -1).c_str());
    std::fflush(stdout);
    return Status::Ok();
  }
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return Status::IoError("cannot create " + tmp + ": " + std::strerror(errno));
  const std::string text = ReportJson(data, 1) + "\n";
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!wrote || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return Status::IoError("cannot write " + path + ": " + why);
  }
  return Status::Ok();
}

std::string SummaryLine(const ReportData& r) {
  const Summary s = Summarize(r.iterations);
  int applied = 0, lost = 0;
  for (const PlanRecord& p : r.plans) applied += p.status == "applied" ? 1 : 0;
  for (const RestartRecord& x : r.restarts) lost += x.lost_iterations;
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "falcon-train-emu: %d ranks %s M=%d L=%d act=%zuB grad=%zuB dp-mode=%s: %d iterations, "
                "iteration median %.2f ms min %.2f ms max %.2f ms p95 %.2f ms, plans applied %d rejected %zu, "
                "restarts %zu (lost %d iterations), check=%s, status=%s",
                r.world_size, ToString(r.options.shape).c_str(), r.options.micro_batches, r.options.layers,
                r.options.ActivationBytes(), r.options.GradBytes(), DpModeName(r.options.dp_mode), s.iterations,
                s.median_s * 1e3, s.min_s * 1e3, s.max_s * 1e3, s.p95_s * 1e3, applied,
                r.plans.size() - static_cast<std::size_t>(applied), r.restarts.size(), lost,
                r.options.check ? "on" : "off", r.status.c_str());
  return buf;
}

}  // namespace falcon::train
