// Mitigation decisions: see mitigation.h.
#include "daemon/controller/mitigation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <map>
#include <set>

#include "analyzer/microbatch_plan.h"
#include "analyzer/pipeline_plan.h"
#include "analyzer/restart_plan.h"
#include "daemon/protocol/messages.h"

namespace falcon::controller {
namespace {

using nlohmann::json;
using analyzer::Strategy;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string Fixed(double v, int digits = 2) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

const char* Code(Strategy s) {
  switch (s) {
    case Strategy::kIgnore: return "S1";
    case Strategy::kRebalanceMicrobatches: return "S2";
    case Strategy::kAdjustTopology: return "S3";
    case Strategy::kCheckpointRestart: return "S4";
    case Strategy::kAdaptPipeline: return "pipeline";
  }
  return "S1";
}

std::optional<Strategy> FromCode(const std::string& c) {
  for (Strategy s : {Strategy::kIgnore, Strategy::kRebalanceMicrobatches, Strategy::kAdjustTopology,
                     Strategy::kCheckpointRestart, Strategy::kAdaptPipeline}) {
    if (c == Code(s)) return s;
  }
  return std::nullopt;
}

// Members of a communicator as an arithmetic progression: its stride, or 0.
std::int64_t Stride(const CommInfo& c) {
  if (c.members.size() < 2 || !c.complete()) return 0;
  const std::int64_t d = c.members[1] - c.members[0];
  if (d <= 0) return 0;
  for (std::size_t i = 2; i < c.members.size(); ++i) {
    if (c.members[i] - c.members[i - 1] != d) return 0;
  }
  return d;
}

double Ratio(const json& finding) {
  const json& e = finding.value("evidence", json::object());
  const json& r = e.value("ratio", json(1.0));
  return r.is_number() && std::isfinite(r.get<double>()) ? std::max(1.0, r.get<double>()) : 1.0;
}

std::int32_t NodeOfHost(const JobLayout& layout, const json& host) {
  if (!host.is_string()) return -1;
  const auto it = std::find(layout.hosts.begin(), layout.hosts.end(), host.get<std::string>());
  return it == layout.hosts.end() ? -1 : static_cast<std::int32_t>(it - layout.hosts.begin());
}

analyzer::JobCostModel CostModel(const MitigationSettings& s, double compute_factor, double link_factor) {
  analyzer::JobCostModel m;
  if (s.micro_batches > 0) m.microbatches = s.micro_batches;
  m.slow_compute_factor = std::max(1.0, compute_factor);
  m.slow_link_bandwidth_Bps = m.inter_node_bandwidth_Bps / std::max(1.0, link_factor);
  return m;
}

// Each candidate: {"overhead_s": x} plus a plan and its gain, or {"unavailable": why}.
// S2. A culprit replica's time per micro-batch is its slow GPU's GEMM ratio, bounded by what the
// job itself measured: the whole job waits for its slowest replica, so no replica is slower than
// the job. A slow GPU holds up only its own stage (and TP peers), so a replica usually slows less
// than its GEMM does. The bound per micro-batch is the pace under which 1F1B (M + PP - 1
// micro-batch periods, the fill at the healthy pace) takes the slow iteration time measured.
json PlanRebalance(const MitigationSettings& s, const json& gpus, const Result<JobLayout>& layout,
                   const JobTiming& timing) {
  if (gpus.empty()) return {{"unavailable", "no slow GPU: re-balancing cannot help a communication fault"}};
  if (s.micro_batches <= 0) return {{"unavailable", "the job's micro-batches per replica are unknown (micro-batches)"}};
  if (!layout.ok()) return {{"unavailable", "job layout unknown: " + layout.status().message()}};
  const analyzer::JobPlacement& p = layout.value().placement;
  const double fill = static_cast<double>(p.shape.pp - 1);
  const double m_per_replica = static_cast<double>(s.micro_batches);
  std::optional<double> measured;  // the slowest replica's pace per micro-batch, from the job's iteration time
  if (timing.even_split && std::isfinite(timing.healthy_s) && std::isfinite(timing.slow_s) && timing.healthy_s > 0 &&
      timing.slow_s > timing.healthy_s) {
    const double job = timing.slow_s / timing.healthy_s;
    measured = (job * (m_per_replica + fill) - fill) / m_per_replica;
  }
  std::vector<double> times(static_cast<std::size_t>(p.shape.dp), 1.0);
  for (const json& g : gpus) {
    const std::int64_t rank = g.value("rank", std::int64_t{-1});
    if (rank < 0 || rank >= static_cast<std::int64_t>(p.node_of_rank.size())) continue;
    const std::size_t dp = static_cast<std::size_t>(analyzer::CoordOf(p.shape, static_cast<std::int32_t>(rank)).dp_index);
    times[dp] = std::max(times[dp], measured ? std::min(Ratio(g), *measured) : Ratio(g));
  }
  const std::int64_t total = std::int64_t{s.micro_batches} * p.shape.dp;
  Result<analyzer::MicrobatchPlan> plan = analyzer::PlanMicrobatches(times, total);
  if (!plan.ok()) return {{"unavailable", plan.status().message()}};
  const analyzer::MicrobatchPlan& m = plan.value();
  if (m.bottleneck_after_s >= m.bottleneck_before_s) {
    return {{"unavailable", "no allocation beats the even split (one DP replica, or every replica slow alike)"}};
  }
  // Once the GPUs recover, the fullest replica sets the pace: a 1F1B replica of M micro-batches
  // over PP stages runs M + PP - 1 micro-batch periods.
  const std::int64_t fullest = *std::max_element(m.microbatches.begin(), m.microbatches.end());
  const double fault_free_ratio = (static_cast<double>(fullest) + fill) / (m_per_replica + fill);
  json out = {{"overhead_s", s.overheads.rebalance_s},
              {"plan", {{"strategy", "S2"}, {"micro_batches", m.microbatches}}},
              {"fault_free_ratio", fault_free_ratio},
              {"baseline", m.baseline},
              {"gradient_weights", m.gradient_weights},
              {"replica_times", times},
              {"expected_gain", 1.0 - m.bottleneck_after_s / m.bottleneck_before_s}};
  if (measured) out["measured_replica_time"] = *measured;
  return out;
}

json TopologyJson(const analyzer::TopologyPlan& t, double overhead_s, const char* kind) {
  json swaps = json::array();
  for (const analyzer::NodeSwap& s : t.swaps) swaps.push_back({s.a, s.b});
  return {{"overhead_s", overhead_s},
          {"plan", {{"strategy", "S3"}, {"placement", t.node_of_rank}}},
          {"kind", kind},
          {"swaps", swaps},
          {"expected_gain", t.iteration_before_s > 0 ? 1.0 - t.iteration_after_s / t.iteration_before_s : 0.0}};
}

json PlanConsolidation(const MitigationSettings& s, const json& findings, const JobLayout& l) {
  std::vector<std::int32_t> ranks;
  double factor = 1;
  for (const json& g : findings.value("gpus", json::array())) {
    ranks.push_back(static_cast<std::int32_t>(g.value("rank", -1)));
    factor = std::max(factor, Ratio(g));
  }
  Result<std::vector<analyzer::GpuId>> gpus = analyzer::GpusOfRanks(l.placement, ranks);
  if (!gpus.ok()) return {{"unavailable", gpus.status().message()}};
  Result<analyzer::TopologyPlan> t =
      analyzer::PlanStragglerConsolidation(l.placement, CostModel(s, factor, 1), gpus.value());
  if (!t.ok()) return {{"unavailable", t.status().message()}};
  if (t.value().swaps.empty()) return {{"unavailable", "the stragglers already share the fewest PP stages"}};
  return TopologyJson(t.value(), s.overheads.topology_s, "straggler consolidation");
}

json PlanLinkRelief(const MitigationSettings& s, const json& findings, const JobLayout& l);

// S3. Slow GPUs: consolidation, or link relief when slow links were named too and the cost model
// expects more from it. Slow links: link relief. A slow NIC: none.
json PlanTopology(const MitigationSettings& s, const std::string& cause, const json& findings,
                  const Result<JobLayout>& layout) {
  if (cause == "nic") return {{"unavailable", "a slow NIC carries its node's inter-node traffic under any placement"}};
  if (!layout.ok()) return {{"unavailable", "job layout unknown: " + layout.status().message()}};
  const JobLayout& l = layout.value();
  if (cause != "compute") return PlanLinkRelief(s, findings, l);
  json consolidation = PlanConsolidation(s, findings, l);
  if (findings.value("links", json::array()).empty()) return consolidation;
  json relief = PlanLinkRelief(s, findings, l);
  if (relief.contains("unavailable")) return consolidation;
  if (consolidation.contains("unavailable") ||
      relief.value("expected_gain", 0.0) > consolidation.value("expected_gain", 0.0)) {
    return relief;
  }
  return consolidation;
}

json PlanLinkRelief(const MitigationSettings& s, const json& findings, const JobLayout& l) {
  const json links = findings.value("links", json::array());
  if (links.empty()) return {{"unavailable", "no slow link named"}};
  const json& k = links.front();  // the worst-evidenced link comes first
  const json hosts = k.value("hosts", json::array());
  if (hosts.size() != 2) return {{"unavailable", "the slow link's hosts are unknown"}};
  const analyzer::NodePair pair{NodeOfHost(l, hosts[0]), NodeOfHost(l, hosts[1])};
  if (pair.a < 0 || pair.b < 0) return {{"unavailable", "the slow link's hosts are not in the job"}};
  if (pair.a == pair.b) return {{"unavailable", "a slow link inside one node cannot be re-placed away"}};
  Result<analyzer::TopologyPlan> t = analyzer::PlanLinkRelief(l.placement, CostModel(s, 1, Ratio(k)), pair);
  if (!t.ok()) return {{"unavailable", t.status().message()}};
  if (t.value().swaps.empty()) return {{"unavailable", "no node swap lightens the slow link's traffic"}};
  json out = TopologyJson(t.value(), s.overheads.topology_s, "link relief");
  out["link"] = {pair.a, pair.b};
  return out;
}

// Pipeline links (i: between stage i and i + 1) that cross one of the slow links the findings
// name: a PP neighbour pair whose nodes are the link's two hosts.
std::set<std::int32_t> SlowPipelineLinks(const json& findings, const JobLayout& l) {
  const analyzer::JobShape& shape = l.placement.shape;
  const std::int32_t stage_ranks = shape.tp * shape.dp;
  std::set<std::int32_t> out;
  for (const json& k : findings.value("links", json::array())) {
    const json hosts = k.value("hosts", json::array());
    if (hosts.size() != 2) continue;
    const std::int32_t a = NodeOfHost(l, hosts[0]), b = NodeOfHost(l, hosts[1]);
    if (a < 0 || b < 0) continue;
    for (std::int32_t r = 0; r + stage_ranks < static_cast<std::int32_t>(l.placement.node_of_rank.size()); ++r) {
      const std::int32_t x = l.placement.node_of_rank[static_cast<std::size_t>(r)];
      const std::int32_t y = l.placement.node_of_rank[static_cast<std::size_t>(r + stage_ranks)];
      if ((x == a && y == b) || (x == b && y == a)) out.insert(analyzer::CoordOf(shape, r).pp_stage);
    }
  }
  return out;
}

}  // namespace

double ProfiledLinkDelay(const json& findings, const JobView& view) {
  const json& suspicion = findings.value("suspicion", json::object());
  const json& evidence = suspicion.is_object() ? suspicion.value("comms", json::array()) : json::array();
  std::map<std::string, const json*> by_comm;
  for (const json& e : evidence) {
    // The state document round-trips through Redis: nothing here may assume a field's type.
    if (e.is_object() && e.contains("verdict") && e["verdict"] == "suspicious" && e.contains("comm") &&
        e["comm"].is_string()) {
      by_comm[e["comm"].get<std::string>()] = &e;
    }
  }
  double delay = 0;
  for (const json& k : findings.value("links", json::array())) {
    const json hosts = k.value("hosts", json::array());
    if (hosts.size() != 2 || !hosts[0].is_string() || !hosts[1].is_string()) continue;
    const std::set<std::string> ends = {hosts[0].get<std::string>(), hosts[1].get<std::string>()};
    if (ends.size() != 2) continue;
    for (const auto& [id, info] : view.comms()) {
      if (info.nranks != 2 || !info.complete()) continue;
      const std::string* a = view.HostOf(info.members[0]);
      const std::string* b = view.HostOf(info.members[1]);
      if (a == nullptr || b == nullptr || std::set<std::string>{*a, *b} != ends) continue;
      auto e = by_comm.find(protocol::CommIdHex(id));
      if (e == by_comm.end()) continue;
      const json& ev = *e->second;
      if (!ev.contains("metric_s") || !ev["metric_s"].is_number() || !ev.contains("baseline_s") ||
          !ev["baseline_s"].is_number()) {
        continue;
      }
      const double metric = ev["metric_s"].get<double>(), baseline = ev["baseline_s"].get<double>();
      if (std::isfinite(metric) && std::isfinite(baseline) && metric > baseline) delay = std::max(delay, metric - baseline);
    }
  }
  return delay;
}

namespace {

// Adapting the pipeline (Adaptra): new warm-up counts that let the slow pipeline links run late
// without idling the stages behind them. The model is the job's own figures: S stages of equal
// work, a micro-batch's forward a third of its work (backward twice the forward), the stage
// time from the healthy iteration ((N + S - 1) micro-batch periods under 1F1B), and one delay on
// every slow pipeline link: the one the round's profile timed on the stage pairs across it when
// it did (timing.profiled_link_delay_s), else the one under which 1F1B takes the slow iteration
// time observed (fitted; both are in the candidate).
json PlanPipeline(const MitigationSettings& s, const json& findings, const Result<JobLayout>& layout,
                  const JobTiming& timing) {
  if (findings.value("links", json::array()).empty()) return {{"unavailable", "no slow link"}};
  if (!layout.ok()) return {{"unavailable", "job layout unknown: " + layout.status().message()}};
  const JobLayout& l = layout.value();
  const std::int32_t stages = l.placement.shape.pp;
  if (stages < 2) return {{"unavailable", "no pipeline parallelism (PP 1)"}};
  const std::set<std::int32_t> links = SlowPipelineLinks(findings, l);
  if (links.empty()) return {{"unavailable", "no slow link joins two pipeline stages"}};
  if (s.micro_batches <= 0) return {{"unavailable", "the job's micro-batches per replica are unknown (micro-batches)"}};
  const std::int32_t n = s.micro_batches;
  if (!(timing.healthy_s > 0) || !(timing.slow_s > timing.healthy_s)) {
    return {{"unavailable", "no slow iteration time against a healthy one to size the link's delay from"}};
  }
  const bool profiled = timing.profiled_link_delay_s > 0 && std::isfinite(timing.profiled_link_delay_s);
  // The fit below assumes every replica ran n micro-batches: an iteration time taken under an
  // earlier S2's counts says nothing about this link (the counts, not the link, set its length).
  if (!profiled && !timing.even_split) {
    return {{"unavailable",
             "the slow iteration time ran under re-balanced micro-batch counts and the profile timed no delay "
             "on the link: nothing to size the link's delay from"}};
  }
  const double period = timing.healthy_s / static_cast<double>(n + stages - 1);
  analyzer::PipelineModel model;
  model.stages.assign(static_cast<std::size_t>(stages), {period / 3, 2 * period / 3, 0});
  model.link_delay_s.assign(static_cast<std::size_t>(stages - 1), 0.0);
  Result<std::vector<std::int32_t>> standard = analyzer::StandardWarmup(stages, n);
  if (!standard.ok()) return {{"unavailable", standard.status().message()}};
  auto one_f_one_b = [&](double delay) -> Result<double> {
    for (const std::int32_t i : links) model.link_delay_s[static_cast<std::size_t>(i)] = delay;
    return analyzer::WarmupIterationTime(model, standard.value(), n);
  };
  // The delay that explains the slowdown (1F1B's time grows with it): bisection.
  double lo = 0, hi = timing.slow_s;
  for (int i = 0; i < 60 && hi - lo > 1e-9 * timing.slow_s; ++i) {
    const double mid = (lo + hi) / 2;
    Result<double> t = one_f_one_b(mid);
    if (!t.ok()) return {{"unavailable", t.status().message()}};
    (t.value() < timing.slow_s ? lo : hi) = mid;
  }
  // Reported only where it means something (the job's own split).
  const json fitted = timing.even_split ? json(hi) : json(nullptr);
  const double delay = profiled ? timing.profiled_link_delay_s : hi;
  const char* source = profiled ? "profile" : "iteration time";
  // What the job runs now, 1F1B under that delay (not the planner's baseline, which a limit
  // below the pipeline depth would have clamped).
  Result<double> now = one_f_one_b(delay);
  if (!now.ok()) return {{"unavailable", now.status().message()}};
  analyzer::PipelineAdaptRequest req;
  req.model = model;
  req.microbatches = n;
  const std::int32_t limit = s.pipeline_activation_limit > 0 ? s.pipeline_activation_limit : stages;
  req.activation_limit.assign(static_cast<std::size_t>(stages), std::min(limit, n));
  Result<analyzer::PipelinePlan> plan = analyzer::AdaptPipeline(req);
  if (!plan.ok()) return {{"unavailable", plan.status().message()}};
  const analyzer::PipelinePlan& p = plan.value();
  const double gain = 1.0 - p.iteration_s / now.value();
  if (gain < 0.01) {
    return {{"unavailable", "no warm-up counts within the activation limit (" + std::to_string(limit) +
                                " micro-batches per stage) beat 1F1B under this delay"},
            {"links", links},
            {"link_delay_s", delay},
            {"link_delay_source", source},
            {"link_delay_fitted_s", fitted},
            {"stage_period_s", period}};
  }
  std::vector<std::int32_t> counts;  // Megatron's num_warmup_microbatches: forwards before the first backward, less one
  for (const std::int32_t x : p.warmup) counts.push_back(std::max(0, x - 1));
  return {{"overhead_s", s.overheads.pipeline_s},
          {"plan", {{"strategy", "pipeline"}, {"warmup", counts}}},
          {"kind", "warm-up counts"},
          {"links", links},
          {"link_delay_s", delay},
          {"link_delay_source", source},
          {"link_delay_fitted_s", fitted},
          {"stage_period_s", period},
          {"activation_limit", limit},
          {"iteration_s", p.iteration_s},
          {"baseline_iteration_s", now.value()},
          {"optimal", p.exhaustive},
          {"expected_gain", gain}};
}

json PlanRestartCandidate(const MitigationSettings& s, const json& findings,
                          const Result<JobLayout>& layout) {
  if (!layout.ok()) return {{"unavailable", "job layout unknown: " + layout.status().message()}};
  const JobLayout& l = layout.value();
  std::set<std::int32_t> faulty;
  // Every culprit's node: a slow GPU's, a slow NIC's, and one end of each slow link (leaving out
  // one end is enough to take the link out of the job).
  for (const json& g : findings.value("gpus", json::array())) faulty.insert(NodeOfHost(l, g.value("host", json())));
  for (const json& n : findings.value("nics", json::array())) faulty.insert(NodeOfHost(l, n.value("host", json())));
  for (const json& k : findings.value("links", json::array())) {
    const json hosts = k.value("hosts", json::array());
    if (hosts.size() == 2 && !faulty.count(NodeOfHost(l, hosts[0]))) faulty.insert(NodeOfHost(l, hosts[1]));
  }
  faulty.erase(-1);
  if (faulty.empty()) return {{"unavailable", "the culprits' nodes are unknown"}};
  analyzer::RestartRequest r;
  r.tp = l.placement.shape.tp;
  r.dp = l.placement.shape.dp;
  r.pp = l.placement.shape.pp;
  r.gpus_per_node = l.placement.gpus_per_node;
  std::set<std::int32_t> used(l.placement.node_of_rank.begin(), l.placement.node_of_rank.end());
  r.job_nodes.assign(used.begin(), used.end());
  r.faulty_nodes.assign(faulty.begin(), faulty.end());
  r.spare_nodes = l.spares;
  if (s.micro_batches > 0) r.total_microbatches = std::int64_t{s.micro_batches} * r.dp;
  Result<analyzer::RestartPlan> plan = analyzer::PlanRestart(r);
  if (!plan.ok()) return {{"unavailable", plan.status().message()}};
  const analyzer::RestartPlan& p = plan.value();
  if (p.kind == analyzer::RestartKind::kNotPossible) return {{"unavailable", p.reason}};
  json pj = {{"strategy", "S4"}, {"restart", true}, {"exclude_nodes", p.excluded_nodes}};
  if (p.kind == analyzer::RestartKind::kKeepShape) {
    std::map<std::int32_t, std::int32_t> to;
    for (const analyzer::NodeReplacement& x : p.replacements) to[x.faulty] = x.spare;
    std::vector<std::int32_t> placement = l.placement.node_of_rank;
    for (std::int32_t& n : placement) {
      if (auto it = to.find(n); it != to.end()) n = it->second;
    }
    pj["placement"] = placement;
  }
  // After a restart without the culprits the job runs at healthy speed (a smaller DP degree
  // runs proportionally fewer samples per iteration; that is the gain's price, not modelled).
  return {{"overhead_s", s.overheads.restart_s},
          {"plan", pj},
          {"kind", p.kind == analyzer::RestartKind::kKeepShape ? "keep shape" : "shrink data parallel"},
          {"shape", {p.tp, p.dp, p.pp}},
          {"reason", p.reason},
          {"expected_gain", 1.0}};  // replaced below by the slow/healthy ratio when known
}

// The planner's overheads are the candidates' (configured or measured, as Start or UseMeasured
// left them), so a restored planner goes on with the figures its predecessor used.
analyzer::SkiRentalOptions OptionsFrom(const MitigationSettings& s, const json& candidates) {
  analyzer::SkiRentalOptions o;
  o.overheads = s.overheads;
  auto pick = [&](const char* code, double* out) {
    const json c = candidates.value(code, json::object());
    const auto x = c.find("overhead_s");
    if (c.contains("unavailable") || x == c.end() || !x->is_number()) {
      *out = kInf;
    } else if (const double v = x->get<double>(); std::isfinite(v) && v >= 0) {
      *out = v;
    }
  };
  pick("S2", &o.overheads.rebalance_s);
  pick("S3", &o.overheads.topology_s);
  pick("S4", &o.overheads.restart_s);
  pick("pipeline", &o.overheads.pipeline_s);
  return o;
}

struct MeasuredEntry {
  const char* code;
  Strategy strategy;
  std::optional<double> MeasuredOverheads::*field;
};
constexpr MeasuredEntry kMeasured[] = {
    {"S2", Strategy::kRebalanceMicrobatches, &MeasuredOverheads::rebalance_s},
    {"S3", Strategy::kAdjustTopology, &MeasuredOverheads::topology_s},
    {"S4", Strategy::kCheckpointRestart, &MeasuredOverheads::restart_s},
    {"pipeline", Strategy::kAdaptPipeline, &MeasuredOverheads::pipeline_s},
};

bool ValidMeasured(const MeasuredOverheads& m) {
  return std::all_of(std::begin(kMeasured), std::end(kMeasured), [&](const MeasuredEntry& e) {
    const std::optional<double>& v = m.*e.field;
    return !v || (std::isfinite(*v) && *v >= 0);
  });
}

// Marks where each available candidate's overhead comes from, taking the measured ones.
void ApplyMeasured(const MeasuredOverheads& m, json* candidates) {
  for (const MeasuredEntry& e : kMeasured) {
    if (!candidates->contains(e.code)) continue;
    json& c = (*candidates)[e.code];
    if (c.contains("unavailable")) continue;
    if (const std::optional<double>& v = m.*e.field) {
      c["overhead_s"] = *v;
      c["overhead_source"] = "measured";
    } else {
      c["overhead_source"] = "configured";
    }
  }
}

}  // namespace

MeasuredOverheads MeasuredFrom(const JobView& view) {
  MeasuredOverheads out;
  for (const auto& [rank, r] : view.ranks()) {
    for (std::size_t i = 0; i < std::size(kMeasured); ++i) {
      std::optional<double>& v = out.*kMeasured[i].field;
      if (r.cost_s[i] && (!v || *r.cost_s[i] > *v)) v = r.cost_s[i];
    }
  }
  return out;
}

Result<analyzer::JobShape> ParseJobShape(const std::string& text) {
  analyzer::JobShape s;
  char extra = 0;
  if (std::sscanf(text.c_str(), "%dx%dx%d%c", &s.tp, &s.dp, &s.pp, &extra) != 3 || s.tp < 1 || s.dp < 1 || s.pp < 1) {
    return Status::InvalidArgument("job shape \"" + text + "\": expected TPxDPxPP with positive integers, e.g. 2x4x2");
  }
  return s;
}

Result<JobLayout> InferLayout(const JobView& view, const std::string& job_shape,
                              const std::vector<std::int32_t>& excluded) {
  const auto& ranks = view.ranks();
  if (ranks.empty()) return Status::InvalidArgument("no live ranks");
  const std::int64_t world = static_cast<std::int64_t>(ranks.size());
  if (ranks.begin()->first != 0 || ranks.rbegin()->first != world - 1) {
    return Status::InvalidArgument("ranks 0.." + std::to_string(world - 1) + " are not all registered");
  }
  JobLayout out;
  out.hosts = view.hosts();
  std::map<std::int32_t, std::int32_t> per_node;
  for (const auto& [rank, info] : ranks) {
    const std::int32_t node = view.NodeOf(rank);
    if (node < 0) return Status::InvalidArgument("rank " + std::to_string(rank) + " has no host");
    out.placement.node_of_rank.push_back(node);
    ++per_node[node];
  }
  out.placement.num_nodes = static_cast<std::int32_t>(out.hosts.size());
  out.placement.gpus_per_node = per_node.begin()->second;
  for (std::int32_t n = 0; n < out.placement.num_nodes; ++n) {
    if (!per_node.count(n) && std::find(excluded.begin(), excluded.end(), n) == excluded.end()) out.spares.push_back(n);
  }
  for (const auto& [node, n] : per_node) {
    if (n != out.placement.gpus_per_node) {
      return Status::InvalidArgument("uneven ranks per host (" + out.hosts[static_cast<std::size_t>(node)] + " has " +
                                     std::to_string(n) + ", others " + std::to_string(out.placement.gpus_per_node) + ")");
    }
  }
  if (!job_shape.empty()) {
    Result<analyzer::JobShape> s = ParseJobShape(job_shape);
    if (!s.ok()) return s.status();
    out.placement.shape = s.value();
  } else {
    // Families of communicators that partition the job: same stride and size, every rank in one.
    // Communicators with the same members count once (Megatron makes several groups alike: dp
    // and dp-cp, tp and tp-cp when cp = 1); their calls add up.
    struct Family {
      std::int64_t stride = 0, size = 0, covered = 0;
      double calls = 0;
      std::size_t comms = 0;
      std::set<std::vector<std::int64_t>> member_sets;
    };
    std::map<std::pair<std::int64_t, std::int64_t>, Family> families;
    for (const auto& [id, c] : view.comms()) {
      if (c.nranks < 2 || c.nranks >= world) continue;
      const std::int64_t stride = Stride(c);
      if (stride == 0) continue;
      Family& f = families[{stride, c.nranks}];
      f.stride = stride;
      f.size = c.nranks;
      f.calls += static_cast<double>(c.max_calls);
      if (f.member_sets.insert(c.members).second) {
        f.covered += c.nranks;
        ++f.comms;
      }
    }
    // A family counts when it partitions the job and carries calls: Megatron makes groups it
    // never uses (tp-dp, tp-dp-cp: consecutive ranks, no calls), which would otherwise look like
    // the quietest partition. The data-parallel family is the quietest one that fits a layout:
    // its stride is the size of a tensor-parallel family (or 1), and TP x DP divides the world.
    auto used = [&](std::int64_t stride, std::int64_t size) {
      const auto it = families.find({stride, size});
      return it != families.end() && it->second.covered == world && it->second.calls > 0;
    };
    // Pipeline neighbours, where the job shows them: two-rank communicators with calls that chain
    // (a rank paired with two different ranks at one stride) carry the traffic between stages
    // (per-direction stage-pair groups; PyTorch's own communicators for unbatched send/recv).
    // Their stride is TP x DP. It matters when the pipeline group itself carries no calls: then
    // the model-parallel group (the pipeline's members when TP is 1, one call an iteration for
    // the gradient norm) is the quietest partition and would pass for data parallelism.
    std::int64_t stage_stride = 0;
    {
      std::map<std::int64_t, std::map<std::int64_t, std::set<std::int64_t>>> partners;  // stride -> rank -> peers
      for (const auto& [id, c] : view.comms()) {
        const std::int64_t stride = Stride(c);
        if (c.nranks != 2 || stride == 0 || c.max_calls == 0) continue;
        partners[stride][c.members[0]].insert(c.members[1]);
        partners[stride][c.members[1]].insert(c.members[0]);
      }
      std::set<std::int64_t> chains;
      for (const auto& [stride, peers] : partners) {
        if (std::any_of(peers.begin(), peers.end(), [](const auto& p) { return p.second.size() > 1; })) {
          chains.insert(stride);
        }
      }
      if (chains.size() == 1) stage_stride = *chains.begin();
    }
    auto quieter = [](const Family& a, const Family* b) {
      return b == nullptr || a.calls / static_cast<double>(a.comms) < b->calls / static_cast<double>(b->comms);
    };
    const Family* dp = nullptr;
    const Family* dp_fits_stages = nullptr;
    for (const auto& [key, f] : families) {
      if (!used(f.stride, f.size)) continue;  // not a partition (pipeline pairs of a deep pipeline, ...)
      if (f.stride > 1 && !used(1, f.stride)) continue;
      if (world % (f.stride * f.size) != 0) continue;
      if (quieter(f, dp)) dp = &f;
      if (f.stride * f.size == stage_stride && quieter(f, dp_fits_stages)) dp_fits_stages = &f;
    }
    if (dp_fits_stages != nullptr) dp = dp_fits_stages;
    if (dp == nullptr) {
      return Status::InvalidArgument(
          "no family of communicators with calls partitions the job into tensor x data parallel groups: "
          "data parallelism not found (give the shape: --job-shape TPxDPxPP)");
    }
    analyzer::JobShape s;
    s.tp = static_cast<std::int32_t>(dp->stride);
    s.dp = static_cast<std::int32_t>(dp->size);
    s.pp = static_cast<std::int32_t>(world / (std::int64_t{s.tp} * s.dp));
    out.placement.shape = s;
  }
  const analyzer::JobShape& s = out.placement.shape;
  if (std::int64_t{s.tp} * s.dp * s.pp != world) {
    return Status::InvalidArgument("shape " + std::to_string(s.tp) + "x" + std::to_string(s.dp) + "x" +
                                   std::to_string(s.pp) + " does not match " + std::to_string(world) + " ranks");
  }
  if (Status st = analyzer::CheckPlacement(out.placement); !st.ok()) return st;
  return out;
}

Result<Mitigator> Mitigator::Start(const MitigationSettings& settings, const std::string& cause,
                                   const json& findings, const Result<JobLayout>& layout,
                                   const MeasuredOverheads& measured, const JobTiming& timing) {
  analyzer::RootCause root;
  if (cause == "compute") {
    if (findings.value("gpus", json::array()).empty()) return Status::InvalidArgument("compute cause without a slow GPU");
    root = analyzer::RootCause::kCompute;
  } else if (cause == "link" || cause == "nic") {
    root = analyzer::RootCause::kCommunication;
  } else {
    return Status::InvalidArgument("no mitigation for cause \"" + cause + "\"");
  }
  json candidates = json::object();
  if (root == analyzer::RootCause::kCompute) {
    candidates["S2"] = PlanRebalance(settings, findings.value("gpus", json::array()), layout, timing);
  } else {
    candidates["pipeline"] = PlanPipeline(settings, findings, layout, timing);
  }
  candidates["S3"] = PlanTopology(settings, cause, findings, layout);
  // A slow GPU and a slow link at once: link relief leaves the GPU slow, and the planner, once
  // the cost covers S3, goes past S2 for good. So that S3 also re-balances (the counts are a
  // function of the ranks' DP replicas, which re-placing nodes does not change).
  json& s3 = candidates["S3"];
  const json& s2 = candidates.contains("S2") ? candidates["S2"] : json();
  if (s3.value("kind", "") == "link relief" && s2.is_object() && s2.contains("plan")) {
    s3["plan"]["micro_batches"] = s2["plan"]["micro_batches"];
    s3["kind"] = "link relief + re-balance";
    s3["rebalance_expected_gain"] = s2.value("expected_gain", 0.0);
    if (s2.contains("fault_free_ratio")) s3["fault_free_ratio"] = s2["fault_free_ratio"];
  }
  candidates["S4"] = PlanRestartCandidate(settings, findings, layout);
  if (!ValidMeasured(measured)) return Status::InvalidArgument("measured overheads must be >= 0 seconds");
  ApplyMeasured(measured, &candidates);
  Result<analyzer::SkiRentalPlanner> planner = analyzer::SkiRentalPlanner::Create(root, OptionsFrom(settings, candidates));
  if (!planner.ok()) return planner.status();
  return Mitigator(root, std::move(candidates), std::move(planner.value()));
}

json Mitigator::ToJson() const {
  const analyzer::SkiRentalSnapshot s = planner_.Snapshot();
  json applied = json::array();
  for (Strategy x : s.applied) applied.push_back(Code(x));
  return {{"cause", cause_ == analyzer::RootCause::kCompute ? "compute" : "communication"},
          {"candidates", candidates_},
          {"applied", applied},
          {"rebalance_in_effect", s.rebalance_in_effect},
          {"pipeline_in_effect", s.pipeline_in_effect},
          {"stopped", s.stopped},
          {"slowdown_s", s.slowdown_s},
          {"paid_s", s.paid_s},
          {"last_time_s", s.last_time_s},
          {"calm_samples", s.calm_samples}};
}

Result<Mitigator> Mitigator::FromJson(const MitigationSettings& settings, const json& doc) {
  try {
    const std::string cause = doc.at("cause").get<std::string>();
    if (cause != "compute" && cause != "communication") return Status::InvalidArgument("mitigation: bad cause");
    const analyzer::RootCause root =
        cause == "compute" ? analyzer::RootCause::kCompute : analyzer::RootCause::kCommunication;
    const json& candidates = doc.at("candidates");
    if (!candidates.is_object()) return Status::InvalidArgument("mitigation: candidates is not an object");
    analyzer::SkiRentalSnapshot s;
    for (const json& a : doc.at("applied")) {
      const auto x = FromCode(a.get<std::string>());
      if (!x) return Status::InvalidArgument("mitigation: unknown strategy " + a.dump());
      s.applied.push_back(*x);
    }
    s.rebalance_in_effect = doc.at("rebalance_in_effect").get<bool>();
    s.pipeline_in_effect = doc.value("pipeline_in_effect", false);  // absent in documents before pipelines
    s.stopped = doc.at("stopped").get<bool>();
    s.slowdown_s = doc.at("slowdown_s").get<double>();
    s.paid_s = doc.at("paid_s").get<double>();
    s.last_time_s = doc.at("last_time_s").get<double>();
    s.calm_samples = doc.at("calm_samples").get<std::int32_t>();
    Result<analyzer::SkiRentalPlanner> p =
        analyzer::SkiRentalPlanner::Restore(root, OptionsFrom(settings, candidates), s);
    if (!p.ok()) return p.status();
    return Mitigator(root, candidates, std::move(p.value()));
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("mitigation: ") + e.what());
  }
}

Decision Mitigator::MakeDecision(const analyzer::MitigationDecision& d) const {
  Decision out;
  out.planner = d;
  out.strategy = Code(d.to);
  out.from = Code(d.from);
  if (d.kind == analyzer::DecisionKind::kSwitch) {
    const json c = candidates_.value(out.strategy, json::object());
    out.plan = c.value("plan", json{{"strategy", out.strategy}});
    out.expected_gain = c.value("expected_gain", 0.0);
    out.publish_plan = true;
    out.summary = std::string(analyzer::StrategyName(d.to)) + " (" + c.value("kind", std::string("plan")) +
                  "): expected " + Fixed(out.expected_gain * 100, 0) + "% shorter iterations; " + d.reason;
  } else {
    out.plan = {{"strategy", "S1"}};
    const bool undo = d.undo_rebalance || CarriesRebalance(Code(d.from));
    if (undo) {
      const json c = candidates_.value("S2", json::object());
      if (c.contains("baseline")) out.plan["micro_batches"] = c["baseline"];
      out.publish_plan = true;
    }
    if (d.undo_pipeline) out.publish_plan = true;  // S1: back to the framework's own warm-up counts
    out.summary = "stop mitigating: " + d.reason + (undo && !d.undo_rebalance ? "; undo the micro-batch re-balancing" : "");
  }
  return out;
}

Result<std::optional<Decision>> Mitigator::Observe(double now_s, double iteration_s, double healthy_s,
                                                   std::int64_t iterations) {
  Result<std::optional<analyzer::MitigationDecision>> d =
      planner_.Observe({now_s, iteration_s, healthy_s, std::max<std::int64_t>(1, iterations)});
  if (!d.ok()) return d.status();
  if (!d.value()) return std::optional<Decision>();
  Decision out = MakeDecision(*d.value());
  if (out.strategy == "S4" && iteration_s > 0) out.expected_gain = std::max(0.0, 1.0 - healthy_s / iteration_s);
  return std::optional<Decision>(std::move(out));
}

Result<std::vector<std::string>> Mitigator::UseMeasured(const MeasuredOverheads& measured) {
  if (!ValidMeasured(measured)) return Status::InvalidArgument("measured overheads must be >= 0 seconds");
  std::vector<std::string> changes;
  for (const MeasuredEntry& e : kMeasured) {
    const std::optional<double>& v = measured.*e.field;
    if (!v || !candidates_.contains(e.code) || candidates_[e.code].contains("unavailable")) continue;
    json& c = candidates_[e.code];
    const double old = c.value("overhead_s", kInf);
    if (std::abs(*v - old) <= std::max(0.01, 0.01 * old)) continue;
    if (Status st = planner_.SetOverhead(e.strategy, *v); !st.ok()) continue;  // not the planner's candidate
    changes.push_back(std::string(e.code) + " " + Fixed(old, 2) + " s -> " + Fixed(*v, 2) + " s (measured)");
    c["overhead_s"] = *v;
    c["overhead_source"] = "measured";
  }
  return changes;
}

Result<Decision> Mitigator::End(double now_s) {
  Result<analyzer::MitigationDecision> d = planner_.End(std::max(now_s, planner_.Snapshot().last_time_s));
  if (!d.ok()) return d.status();
  return MakeDecision(d.value());
}

std::string Mitigator::current() const { return Code(planner_.current()); }
bool Mitigator::rebalance_in_effect() const {
  return planner_.Snapshot().rebalance_in_effect || CarriesRebalance(current());
}
bool Mitigator::pipeline_in_effect() const { return planner_.Snapshot().pipeline_in_effect; }

std::optional<double> Mitigator::FaultFreeRatio() const {
  if (stopped()) return std::nullopt;
  const analyzer::SkiRentalSnapshot s = planner_.Snapshot();
  const std::string now = current();
  // S2's counts, alone or carried by an S3: the fullest replica's pace once the GPUs recover.
  // With adapted warm-up counts too, that pace still holds (the counts only add slack).
  if (s.rebalance_in_effect || CarriesRebalance(now)) {
    const json& c = candidates_.value(s.rebalance_in_effect ? "S2" : now, json::object());
    const json& r = c.value("fault_free_ratio", json());
    if (!r.is_number() || !std::isfinite(r.get<double>()) || r.get<double>() < 1.0) return std::nullopt;
    return r.get<double>();
  }
  if (s.pipeline_in_effect) return 1.0;
  return std::nullopt;  // a placement alone: no pace of its own to tell the fault's end by
}

bool Mitigator::CarriesRebalance(const std::string& strategy) const {
  if (strategy != "S3") return false;  // S2 is the planner's to track; S4 restarts with its own counts
  const json c = candidates_.value(strategy, json::object());
  return c.contains("plan") && c["plan"].contains("micro_batches");
}
bool Mitigator::stopped() const { return planner_.stopped(); }
double Mitigator::accumulated_slowdown_s() const { return planner_.accumulated_slowdown_s(); }

std::set<std::string> Culprits(const json& findings) {
  std::set<std::string> out;
  for (const json& g : findings.value("gpus", json::array())) out.insert("gpu " + g.value("rank", json()).dump());
  for (const json& k : findings.value("links", json::array())) {
    json hosts = k.value("hosts", json::array());
    if (hosts.size() == 2 && hosts[1] < hosts[0]) std::swap(hosts[0], hosts[1]);
    out.insert("link " + hosts.dump());
  }
  for (const json& n : findings.value("nics", json::array())) out.insert("nic " + n.value("host", json()).dump());
  return out;
}

bool CulpritsChanged(const json& before, const json& after, const std::string& strategy) {
  const std::set<std::string> was = Culprits(before), now = Culprits(after);
  if (was == now) return false;
  if (!std::includes(was.begin(), was.end(), now.begin(), now.end())) return true;  // someone new
  if (strategy != "S3" && strategy != "S4") return true;
  return std::any_of(was.begin(), was.end(), [&](const std::string& c) { return !now.count(c) && c.rfind("link ", 0) != 0; });
}

}  // namespace falcon::controller
