// ControllerState (de)serialisation: see controller_state.h.
#include "daemon/controller/controller_state.h"

#include <cmath>

#include <charconv>

namespace falcon::controller {
namespace {

using nlohmann::json;

bool ParseId(const std::string& id, std::uint64_t* ms, std::uint64_t* seq) {
  const auto dash = id.find('-');
  if (dash == std::string::npos || dash == 0 || dash + 1 >= id.size()) return false;
  const char* b = id.data();
  auto r1 = std::from_chars(b, b + dash, *ms);
  auto r2 = std::from_chars(b + dash + 1, b + id.size(), *seq);
  return r1.ec == std::errc() && r1.ptr == b + dash && r2.ec == std::errc() && r2.ptr == b + id.size();
}

json IncidentJson(const Incident& i) {
  return {{"id", i.id},          {"opened_ns", i.opened_ns}, {"ranks", i.ranks},
          {"healthy_s", i.healthy_s}, {"localised", i.localised}, {"attempts", i.attempts},
          {"next_attempt_ns", i.next_attempt_ns}, {"cause", i.cause}, {"findings", i.findings},
          {"request", i.request}, {"last_round_ns", i.last_round_ns}, {"mitigation", i.mitigation},
          {"last_feed_ns", i.last_feed_ns}, {"recheck", i.recheck}, {"recheck_interval_s", i.recheck_interval_s},
          {"revalidate", i.revalidate}, {"deferred_rounds", i.deferred_rounds},
          {"best_since_round_s", i.best_since_round_s}, {"plan_level_s", i.plan_level_s},
          {"plan_level_after_ns", i.plan_level_after_ns}, {"faster_since_ns", i.faster_since_ns}, {"watch_seen_ns", i.watch_seen_ns}};
}

Incident IncidentFromJson(const json& j) {
  Incident i;
  i.id = j.at("id").get<std::string>();
  i.opened_ns = j.at("opened_ns").get<std::int64_t>();
  i.ranks = j.at("ranks").get<std::vector<std::int64_t>>();
  i.healthy_s = j.at("healthy_s").get<double>();
  i.localised = j.at("localised").get<bool>();
  i.attempts = j.at("attempts").get<int>();
  i.next_attempt_ns = j.at("next_attempt_ns").get<std::int64_t>();
  i.cause = j.at("cause").get<std::string>();
  i.findings = j.at("findings");
  i.request = j.value("request", "");
  i.last_round_ns = j.value("last_round_ns", std::int64_t{0});
  i.mitigation = j.value("mitigation", json());
  if (!i.mitigation.is_null() && !i.mitigation.is_object()) throw std::invalid_argument("mitigation: not an object");
  i.last_feed_ns = j.value("last_feed_ns", std::int64_t{0});
  i.recheck = j.value("recheck", false);
  i.recheck_interval_s = j.value("recheck_interval_s", 0.0);
  i.revalidate = j.value("revalidate", false);
  i.deferred_rounds = j.value("deferred_rounds", 0);
  if (i.deferred_rounds < 0 || i.deferred_rounds > 16) throw std::invalid_argument("bad deferred_rounds");
  i.best_since_round_s = j.value("best_since_round_s", 0.0);
  if (!std::isfinite(i.best_since_round_s) || i.best_since_round_s < 0) throw std::invalid_argument("bad best_since_round_s");
  i.plan_level_s = j.value("plan_level_s", 0.0);  // absent in documents before it
  if (!std::isfinite(i.plan_level_s) || i.plan_level_s < 0) throw std::invalid_argument("bad plan_level_s");
  i.plan_level_after_ns = j.value("plan_level_after_ns", std::int64_t{0});
  i.faster_since_ns = j.value("faster_since_ns", std::int64_t{0});
  i.watch_seen_ns = j.value("watch_seen_ns", std::int64_t{0});  // absent in documents before it
  if (i.watch_seen_ns < 0) throw std::invalid_argument("bad watch_seen_ns");
  if (!std::isfinite(i.recheck_interval_s) || i.recheck_interval_s < 0) throw std::invalid_argument("bad recheck_interval_s");
  if (i.id.empty() || i.id.size() > 64) throw std::invalid_argument("bad incident id");
  return i;
}

}  // namespace

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kTracking: return "tracking";
    case Phase::kProfiling: return "profiling";
    case Phase::kValidating: return "validating";
  }
  return "tracking";
}

bool ValidStreamId(const std::string& id) {
  std::uint64_t ms = 0, seq = 0;
  return ParseId(id, &ms, &seq);
}

std::optional<std::uint64_t> StreamIdMs(const std::string& id) {
  std::uint64_t ms = 0, seq = 0;
  if (!ParseId(id, &ms, &seq)) return std::nullopt;
  return ms;
}

bool StreamIdLess(const std::string& a, const std::string& b) {
  std::uint64_t am = 0, as = 0, bm = 0, bs = 0;
  if (!ParseId(a, &am, &as) || !ParseId(b, &bm, &bs)) return false;
  return am < bm || (am == bm && as < bs);
}

json SlowJson(const std::map<std::int64_t, SlowRank>& slow) {
  json out = json::object();
  for (const auto& [rank, r] : slow) {
    out[std::to_string(rank)] = {{"ratio", r.ratio}, {"level_s", r.level_s},
                                 {"baseline_s", r.baseline_s}, {"onset_ns", r.onset_ns}};
  }
  return out;
}

std::map<std::int64_t, SlowRank> SlowFromJson(const json& j) {
  if (!j.is_object()) throw std::invalid_argument("slow: not an object");
  std::map<std::int64_t, SlowRank> out;
  try {
    for (const auto& [rank, r] : j.items()) {
      std::int64_t n = -1;
      const auto [end, ec] = std::from_chars(rank.data(), rank.data() + rank.size(), n);
      if (ec != std::errc() || end != rank.data() + rank.size() || n < 0) {
        throw std::invalid_argument("slow: '" + rank + "' is not a rank");
      }
      out[n] = {r.at("ratio").get<double>(), r.at("level_s").get<double>(), r.at("baseline_s").get<double>(),
                r.at("onset_ns").get<std::int64_t>()};
    }
  } catch (const json::exception& e) {
    throw std::invalid_argument(std::string("slow: ") + e.what());
  }
  return out;
}

json ToJson(const ControllerState& s, bool with_slow) {
  json j = {{"phase", PhaseName(s.phase)}, {"since_ns", s.since_ns},  {"incidents", s.incidents},
            {"cursors", s.cursors},         {"profile_from_ns", s.profile_from_ns},
            {"suspicion", s.suspicion}};
  if (with_slow) j["slow"] = SlowJson(s.slow);
  if (s.incident) j["incident"] = IncidentJson(*s.incident);
  if (s.healthy_s) j["healthy_s"] = *s.healthy_s;
  j["resolved_ns"] = s.resolved_ns;
  j["plan_version"] = s.plan_version;
  j["nodes"] = {{"hosts", s.node_hosts}, {"placement", s.placement}, {"excluded", s.excluded_nodes},
                {"pending_version", s.pending_version}, {"pending_placement", s.pending_placement},
                {"pending_excluded", s.pending_excluded}};
  return j;
}

ControllerState StateFromJson(const json& j, std::string* why) {
  ControllerState s;
  why->clear();
  try {
    if (!j.is_object()) throw std::invalid_argument("not an object");
    if (!j.at("cursors").is_object()) throw std::invalid_argument("cursors: not an object");
    for (const auto& [name, id] : j.at("cursors").items()) {  // cursors first: kept on later errors
      if (id.is_string() && ValidStreamId(id.get<std::string>())) s.cursors[name] = id.get<std::string>();
    }
    const std::string phase = j.at("phase").get<std::string>();
    if (phase != "tracking" && phase != "profiling" && phase != "validating") {
      throw std::invalid_argument("phase: unknown '" + phase + "'");
    }
    s.phase = phase == "profiling" ? Phase::kProfiling : phase == "validating" ? Phase::kValidating : Phase::kTracking;
    s.since_ns = j.at("since_ns").get<std::int64_t>();
    if (j.at("incidents").is_number_integer() && !j.at("incidents").is_number_unsigned()) {
      throw std::invalid_argument("incidents: negative");
    }
    s.incidents = j.at("incidents").get<std::uint64_t>();
    // Written beside the document since the slow ranks moved to their own field; an older
    // controller's document has them inside.
    if (j.contains("slow")) s.slow = SlowFromJson(j["slow"]);
    if (j.contains("incident")) s.incident = IncidentFromJson(j["incident"]);
    s.profile_from_ns = j.at("profile_from_ns").get<std::int64_t>();
    s.suspicion = j.at("suspicion");
    if (j.contains("healthy_s")) s.healthy_s = j["healthy_s"].get<double>();
    s.resolved_ns = j.value("resolved_ns", std::int64_t{0});  // an older controller's document has none
    if (s.resolved_ns < 0) throw std::invalid_argument("resolved_ns: negative");
    s.plan_version = j.value("plan_version", std::int32_t{0});
    if (s.plan_version < 0) throw std::invalid_argument("plan_version: negative");
    if (j.contains("nodes")) {
      const json& n = j["nodes"];
      s.node_hosts = n.at("hosts").get<std::vector<std::string>>();
      s.placement = n.at("placement").get<std::vector<std::int32_t>>();
      s.excluded_nodes = n.at("excluded").get<std::vector<std::int32_t>>();
      s.pending_version = n.at("pending_version").get<std::int32_t>();
      s.pending_placement = n.at("pending_placement").get<std::vector<std::int32_t>>();
      s.pending_excluded = n.at("pending_excluded").get<std::vector<std::int32_t>>();
      for (const auto* v : {&s.placement, &s.excluded_nodes, &s.pending_placement, &s.pending_excluded}) {
        for (std::int32_t x : *v) {
          if (x < 0 || x > 65535) throw std::invalid_argument("nodes: node index out of range");
        }
      }
    }
    if (s.phase != Phase::kTracking && !s.incident) throw std::invalid_argument("a phase without an incident");
  } catch (const std::exception& e) {
    *why = e.what();
    ControllerState fresh;
    fresh.cursors = std::move(s.cursors);
    return fresh;
  }
  return s;
}

}  // namespace falcon::controller
