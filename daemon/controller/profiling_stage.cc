// ProfilingStage. See profiling_stage.h for the contract.
#include "daemon/controller/profiling_stage.h"

#include <algorithm>
#include <utility>

#include "daemon/common/log_escape.h"
#include "daemon/controller/profile_analysis.h"
#include "daemon/protocol/messages.h"

namespace falcon::controller {
namespace {

using nlohmann::json;

constexpr std::int64_t kNsPerS = 1'000'000'000;

}  // namespace

protocol::Command SetModeCommand(std::string id, const std::string& mode, std::int64_t now_ns, double ack_timeout_s,
                                 std::optional<std::vector<std::int64_t>> ranks) {
  protocol::Command c;
  c.type = "set_mode";
  c.id = std::move(id);
  c.issued_ns = now_ns;
  c.deadline_ns = now_ns + static_cast<std::int64_t>(ack_timeout_s * static_cast<double>(kNsPerS));
  c.ranks = std::move(ranks);
  c.mode = mode;
  return c;
}

ProfilingStage::ProfilingStage(ProfilingStageOptions options, std::shared_ptr<spdlog::logger> log)
    : options_(std::move(options)), log_(std::move(log)) {}

std::vector<OutgoingCommand> ProfilingStage::SetMode(const std::string& mode, const JobView& view,
                                                     std::int64_t now_ns) {
  mode_commands_.clear();  // acks still missing from an earlier switch no longer matter
  // A switch to a timing mode opens new windows; the switch back to track keeps the ones that
  // close (Analyze comes after it).
  if (mode != "track") acked_at_.clear();
  std::vector<OutgoingCommand> out = ToEveryAgent(
      view,
      [&] {
        return SetModeCommand(options_.command_prefix + "-m" + std::to_string(++commands_), mode, now_ns,
                              options_.ack_timeout_s);
      },
      [&](const std::string& id, const std::string& host) { mode_commands_.insert({id, host}); });
  mode_ = mode;
  return out;
}

void ProfilingStage::OnProfile(const json& m) {
  const std::int64_t rank = m["rank"].get<std::int64_t>();
  if (rank >= 0) profiles_[rank] = m;
}

bool ProfilingStage::OnAck(const json& m, std::int64_t* from_ns) {
  if (mode_commands_.erase({m["command"].get<std::string>(), m["host"].get<std::string>()}) == 0) return false;
  if (m["status"] != "ok") {
    log_->warn("event=set_mode_not_ok host={} status={} detail={}", daemon::LogValue(m["host"].get<std::string>()),
               daemon::LogValue(m["status"].get<std::string>()), daemon::LogQuoted(m.value("detail", "")));
  }
  // A rank's profile must cover only time after its own agent switched its shims.
  const std::int64_t at_ns = m["at_ns"].get<std::int64_t>();
  if (mode_ != "track") acked_at_[m["host"].get<std::string>()] = at_ns;
  *from_ns = std::max(*from_ns, at_ns);
  return true;
}

const json* ProfilingStage::Current(std::int64_t rank, const RankInfo& info, std::int64_t from_ns) const {
  auto p = profiles_.find(rank);
  if (p == profiles_.end()) return nullptr;
  auto acked = acked_at_.find(info.agent_host);
  const std::int64_t start = acked != acked_at_.end() ? acked->second : from_ns;
  return p->second["since_ns"].get<std::int64_t>() >= start ? &p->second : nullptr;
}

bool ProfilingStage::Ready(const JobView& view, std::int64_t from_ns) const {
  if (view.ranks().empty() || !mode_commands_.empty()) return false;
  for (const auto& [rank, info] : view.ranks()) {
    const json* p = Current(rank, info, from_ns);
    if (p == nullptr || (*p)["mode"] != "profile") return false;
  }
  return true;
}

json ProfilingStage::Analyze(const JobView& view, std::int64_t from_ns) const {
  std::map<std::int64_t, json> current;
  for (const auto& [rank, info] : view.ranks()) {
    if (const json* p = Current(rank, info, from_ns)) current[rank] = *p;
  }
  analyzer::SuspicionOptions so;
  so.suspicious_ratio = options_.suspicious_ratio;
  Result<ProfileVerdict> v = AnalyzeProfiles(view, current, so);
  json suspicion = {{"profiles", current.size()}, {"suspicious", json::array()}, {"peers", json::array()},
                    {"compute_suspects", json::array()}};
  if (v.ok()) {
    for (std::uint64_t id : v.value().suspicious) suspicion["suspicious"].push_back(protocol::CommIdHex(id));
    for (std::uint64_t id : v.value().peers) suspicion["peers"].push_back(protocol::CommIdHex(id));
    for (const ComputeSuspectFinding& s : v.value().compute_suspects) {
      suspicion["compute_suspects"].push_back({{"rank", s.rank}, {"comm", protocol::CommIdHex(s.comm)},
                                               {"wait_gap", s.wait_gap}, {"confidence", s.confidence}});
    }
    suspicion["comms"] = v.value().evidence;
  } else {
    log_->warn("event=profile_analysis_failed error={}", daemon::LogQuoted(v.status().message()));
    suspicion["error"] = v.status().message();
  }
  // Nothing suspicious (or no timings): every class is tested, each against its own members.
  std::size_t suspicious = suspicion["suspicious"].size();
  if (suspicious == 0) {
    suspicion["sweep"] = true;
    const std::vector<std::uint64_t> sweep = SweepComms(view);
    suspicious = sweep.size();
    if (suspicious > kListedComms) {
      suspicion.erase("suspicious");
      suspicion["suspicious_count"] = suspicious;
    } else {
      for (std::uint64_t id : sweep) suspicion["suspicious"].push_back(protocol::CommIdHex(id));
    }
  }
  // The evidence of a large job: the suspicious communicators' own, the others counted.
  if (json& evidence = suspicion["comms"]; evidence.is_array() && evidence.size() > kListedComms) {
    json kept = json::array(), omitted = json::object();
    for (json& e : evidence) {
      auto found = e.is_object() ? e.find("verdict") : e.end();  // looked up, never inserted
      const json* verdict = e.is_object() && found != e.end() ? &*found : nullptr;
      if (verdict != nullptr && *verdict == "suspicious") {
        kept.push_back(std::move(e));
      } else {
        const std::string name = verdict != nullptr && verdict->is_string() ? verdict->get<std::string>() : "?";
        omitted[name] = omitted.value(name, std::size_t{0}) + 1;
      }
    }
    evidence = std::move(kept);
    suspicion["omitted"] = std::move(omitted);
  } else if (evidence.is_null()) {
    suspicion.erase("comms");  // the analysis failed: no evidence, as before
  }
  log_->info("event=profiled profiles={} suspicious={} peers={} compute_suspects={}", current.size(), suspicious,
             suspicion["peers"].size(), suspicion["compute_suspects"].size());
  return suspicion;
}

}  // namespace falcon::controller
