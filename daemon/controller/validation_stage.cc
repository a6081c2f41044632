// ValidationStage. See validation_stage.h for the contract.
#include "daemon/controller/validation_stage.h"

#include <fmt/format.h>

#include <algorithm>

#include "daemon/protocol/messages.h"

namespace falcon::controller {
namespace {

using nlohmann::json;

json EvidenceJson(const analyzer::Evidence& e) {
  return {{"measured", e.measured}, {"baseline", e.baseline}, {"ratio", e.ratio}, {"sigma", e.sigma},
          {"baseline_count", e.baseline_count}};
}

}  // namespace

Status ValidationStage::Start(const JobView& view, const json& suspicion, const std::string& id, bool release_first) {
  std::vector<std::uint64_t> judged, peers;
  for (const auto& [key, out] : {std::pair{"suspicious", &judged}, std::pair{"peers", &peers}}) {
    for (const json& c : suspicion.value(key, json::array())) {
      if (!c.is_string()) continue;
      if (const auto v = protocol::ParseCommIdHex(c.get<std::string>())) out->push_back(*v);
    }
  }
  // A large sweep comes as its count (profiling_stage.h, "Size"): every shared communicator.
  if (suspicion.value("sweep", false) && !suspicion.contains("suspicious")) judged = SweepComms(view);
  Result<std::vector<ValidationStep>> steps = PlanValidationSteps(view, judged, peers, steps_);
  if (!steps.ok()) return steps.status();
  run_ = std::make_unique<ValidationRun>(id, std::move(steps.value()), settings_, release_first);
  if (suspicion.value("sweep", false) && settings_.gemm_first) run_->SkipSweepAfterCleanGemm();
  return Status::Ok();
}

void ValidationStage::OnAck(json m) {
  if (run_) run_->OnAck(std::move(m));
}

std::vector<OutgoingCommand> ValidationStage::Next(const JobView& view, std::int64_t now_ns) {
  return run_ ? run_->Next(view, now_ns) : std::vector<OutgoingCommand>{};
}

RoundVerdict ValidationStage::Finish(const JobView& view) {
  if (!run_) return {};
  const std::unique_ptr<ValidationRun> run = std::move(run_);
  return VerdictOf(analyzer::Localize(run->Input(), settings_.localization), *run, view);
}

std::vector<OutgoingCommand> ValidationStage::Release(const std::string& id, const JobView& view,
                                                      std::int64_t now_ns) const {
  ValidationRun release(id, {}, settings_, true);
  return release.Next(view, now_ns);
}

RoundVerdict VerdictOf(const Result<analyzer::Localization>& loc, const ValidationRun& run, const JobView& view) {
  RoundVerdict v;
  v.failure = run.failure();
  v.detail = {{"validation", run.Summary()}};
  if (!loc.ok()) {
    v.detail["error"] = loc.status().message();
    return v;
  }
  auto host = [&](std::int32_t node) {
    return node >= 0 && static_cast<std::size_t>(node) < view.hosts().size() ? view.hosts()[static_cast<std::size_t>(node)]
                                                                              : std::string("?");
  };
  auto add = [&](const std::string& what) { v.summary += (v.summary.empty() ? "" : "; ") + what; };
  const analyzer::Localization& l = loc.value();
  json gpus = json::array(), links = json::array(), nics = json::array();
  auto link_json = [&](const analyzer::SlowLink& k) {
    return json{{"ranks", {k.sender, k.receiver}}, {"hosts", {host(k.sender_node), host(k.receiver_node)}},
                {"evidence", EvidenceJson(k.evidence)}};
  };
  for (const analyzer::SlowGpu& g : l.gpus) {
    json explained = json::array();  // its own slow transfers, no slower than its GEMM
    for (const analyzer::SlowLink& k : g.links) explained.push_back(link_json(k));
    gpus.push_back({{"rank", g.rank}, {"host", host(g.node)}, {"evidence", EvidenceJson(g.evidence)},
                    {"explains_links", explained}});
    v.ranks.push_back(g.rank);
    add(fmt::format("slow GPU: rank {} on {} (GEMM {:.2f}x median)", g.rank, host(g.node), g.evidence.ratio));
  }
  for (const analyzer::SlowNic& n : l.nics) {
    nics.push_back({{"host", host(n.node)}, {"slow_peer_nodes", n.slow_peer_nodes},
                    {"tested_peer_nodes", n.tested_peer_nodes}, {"evidence", EvidenceJson(n.evidence)}});
    add(fmt::format("slow NIC: {} ({:.2f}x median transfer time)", host(n.node), n.evidence.ratio));
  }
  for (const analyzer::SlowLink& k : l.links) {
    links.push_back(link_json(k));
    v.ranks.push_back(k.sender);
    v.ranks.push_back(k.receiver);
    add(fmt::format("slow link: {} <-> {} (ranks {}-{}, {:.2f}x median)", host(k.sender_node), host(k.receiver_node),
                    k.sender, k.receiver, k.evidence.ratio));
  }
  v.cause = !l.gpus.empty() ? "compute" : !l.nics.empty() ? "nic" : !l.links.empty() ? "link" : "unknown";
  v.localised = !l.nothing_found();
  v.detail["gpus"] = gpus;
  v.detail["links"] = links;
  v.detail["nics"] = nics;
  v.detail["unassessed"] = {{"gemms", l.gemms_unassessed}, {"transfers", l.transfers_unassessed}};
  std::sort(v.ranks.begin(), v.ranks.end());
  v.ranks.erase(std::unique(v.ranks.begin(), v.ranks.end()), v.ranks.end());
  return v;
}

}  // namespace falcon::controller
