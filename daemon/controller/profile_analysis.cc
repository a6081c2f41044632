// The profiling phase's verdict: see profile_analysis.h.
#include "daemon/controller/profile_analysis.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <limits>
#include <tuple>

#include "analyzer/signature.h"
#include "daemon/protocol/messages.h"

namespace falcon::controller {
namespace {

using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct SigStat {
  std::uint64_t count = 0;
  double mean_us = kNaN;
  double median_us = kNaN;
};

using SigKey = std::tuple<std::string, std::uint64_t, std::int32_t>;  // op, bytes, peer

// One communicator as its members reported it: comm rank -> signature -> stats.
struct CommReport {
  std::int32_t nranks = 0;
  std::map<std::int32_t, std::map<SigKey, SigStat>> members;
};

// Folds one rank's comm_profile into `reports`; entries of the wrong shape are skipped.
void Collect(const json& profile, std::map<std::uint64_t, CommReport>& reports) {
  for (const json& c : profile["comms"]) {
    if (!c.is_object() || !c.contains("id") || !c["id"].is_string() || !c.contains("sigs") ||
        !c["sigs"].is_array()) {
      continue;
    }
    const auto id = protocol::ParseCommIdHex(c["id"].get<std::string>());
    const double rank = ProfileNumber(c, "rank"), nranks = ProfileNumber(c, "nranks");
    if (!id || !(nranks >= 1 && nranks <= (1 << 24)) || !(rank >= 0 && rank < nranks)) continue;
    CommReport& r = reports[*id];
    r.nranks = static_cast<std::int32_t>(nranks);
    auto& sigs = r.members[static_cast<std::int32_t>(rank)];
    for (const json& s : c["sigs"]) {
      if (!s.is_object() || !s.contains("op") || !s["op"].is_string()) continue;
      const double bytes = ProfileNumber(s, "bytes"), peer = ProfileNumber(s, "peer"), count = ProfileNumber(s, "count");
      if (!(bytes >= 0) || !(count >= 0) || !(peer >= -1)) continue;
      SigStat& st = sigs[{s["op"].get<std::string>(), static_cast<std::uint64_t>(bytes),
                          static_cast<std::int32_t>(peer)}];
      st.count = static_cast<std::uint64_t>(count);
      st.mean_us = ProfileNumber(s, "mean_us");
      st.median_us = ProfileNumber(s, "median_us");
    }
  }
}

// A communicator's transfer time per call; NaN without timings. A collective's members finish
// together, so each member's duration is its wait for the last to arrive plus the transfer: the
// least median over the members (the last to arrive waits for nobody) is the transfer's, and a
// slow GPU that makes its group wait does not make the group look slow. A point-to-point transfer
// has two ends (the sender's Send to its peer, the peer's Recv from it): the lesser of the two.
// Weighted by each transfer's calls per member.
double TransferPerCall(const CommReport& r) {
  struct Ends {
    double least = std::numeric_limits<double>::infinity();
    double calls = 0;
    double ends = 0;
  };
  // op, bytes, sender, receiver (-1, -1 for a collective)
  std::map<std::tuple<std::string, std::uint64_t, std::int32_t, std::int32_t>, Ends> transfers;
  for (const auto& [rank, sigs] : r.members) {
    for (const auto& [key, st] : sigs) {
      const auto& [op, bytes, peer] = key;
      const double d = std::isfinite(st.median_us) ? st.median_us : st.mean_us;
      if (!std::isfinite(d) || d < 0 || st.count == 0) continue;
      std::tuple<std::string, std::uint64_t, std::int32_t, std::int32_t> k{op, bytes, -1, -1};
      if (peer >= 0) {
        const bool recv = analyzer::ParseOpKind(op) == analyzer::OpKind::kRecv;
        const bool p2p = recv || analyzer::ParseOpKind(op) == analyzer::OpKind::kSend;
        k = {p2p ? std::string("P2P") : op, bytes, recv ? peer : rank, recv ? rank : peer};
      }
      Ends& e = transfers[k];
      e.least = std::min(e.least, d);
      e.calls += static_cast<double>(st.count);
      e.ends += 1;
    }
  }
  double weighted = 0, calls = 0;
  for (const auto& [k, e] : transfers) {
    weighted += e.least * e.calls / e.ends;
    calls += e.calls / e.ends;
  }
  return calls > 0 ? weighted / calls * 1e-6 : kNaN;
}

analyzer::CommProfile ToAnalyzer(std::uint64_t id, const CommReport& r, const JobView& view) {
  analyzer::CommProfile p;
  p.id = id;
  p.nranks = static_cast<std::uint32_t>(r.nranks);
  auto known = view.comms().find(id);
  if (known != view.comms().end() && known->second.complete() &&
      known->second.members.size() == p.nranks) {
    for (std::int64_t m : known->second.members) p.members.push_back(static_cast<std::int32_t>(m));
  }
  std::set<std::pair<std::string, std::uint64_t>> terms;
  for (const auto& [rank, sigs] : r.members) {
    for (const auto& [key, st] : sigs) {
      if (st.count > 0) terms.insert({std::get<0>(key), std::get<1>(key)});
    }
  }
  for (const auto& [op, bytes] : terms) p.signature.push_back({analyzer::ParseOpKind(op), bytes, 1});
  return p;
}

// The collectives every member timed, as rows of FindComputeSuspect.
std::optional<ComputeSuspectFinding> SuspectIn(std::uint64_t id, const CommReport& r,
                                               const JobView& view) {
  auto known = view.comms().find(id);
  if (r.nranks < 2 || known == view.comms().end() || !known->second.complete() ||
      static_cast<std::int32_t>(r.members.size()) != r.nranks) {
    return std::nullopt;
  }
  std::vector<double> wait;
  std::size_t rows = 0;
  for (const auto& [key, first] : r.members.begin()->second) {
    if (std::get<2>(key) >= 0) continue;  // point-to-point: the two ends differ
    std::vector<double> row;
    for (const auto& [rank, sigs] : r.members) {
      auto it = sigs.find(key);
      if (it == sigs.end() || !std::isfinite(it->second.median_us) || it->second.median_us < 0) break;
      row.push_back(it->second.median_us * 1e-6);
    }
    if (row.size() != static_cast<std::size_t>(r.nranks)) continue;
    wait.insert(wait.end(), row.begin(), row.end());
    ++rows;
  }
  if (rows == 0) return std::nullopt;
  analyzer::CollectiveTimings t;
  t.nranks = static_cast<std::size_t>(r.nranks);
  t.wait_s = wait;
  analyzer::ComputeSuspectOptions o;
  o.min_calls = 1;
  Result<analyzer::ComputeSuspect> s = analyzer::FindComputeSuspect(t, o);
  if (!s.ok() || s.value().verdict != analyzer::SuspectVerdict::kFound) return std::nullopt;
  return ComputeSuspectFinding{known->second.members[static_cast<std::size_t>(s.value().rank)], id,
                               s.value().wait_gap, s.value().confidence};
}

const char* VerdictName(analyzer::CommVerdict v) {
  switch (v) {
    case analyzer::CommVerdict::kHealthy: return "healthy";
    case analyzer::CommVerdict::kSuspicious: return "suspicious";
    case analyzer::CommVerdict::kNoPeers: return "no_peers";
    case analyzer::CommVerdict::kNoData: return "no_data";
  }
  return "?";
}

}  // namespace

Result<ProfileVerdict> AnalyzeProfiles(const JobView& view,
                                       const std::map<std::int64_t, json>& profiles,
                                       const analyzer::SuspicionOptions& suspicion) {
  std::map<std::uint64_t, CommReport> reports;
  ProfileVerdict v;
  for (const auto& [rank, p] : profiles) {
    Collect(p, reports);
    if (p["mode"] == "profile" || p["mode"] == "sample") ++v.ranks_with_timings;
  }
  std::vector<analyzer::CommProfile> comms;
  std::vector<double> metric;
  for (const auto& [id, r] : reports) {
    comms.push_back(ToAnalyzer(id, r, view));
    metric.push_back(TransferPerCall(r));
  }
  Result<analyzer::CommClassification> classes = analyzer::ClassifyCommunicators(comms);
  if (!classes.ok()) return classes.status();
  Result<std::vector<analyzer::CommAssessment>> flags =
      analyzer::FlagSuspicious(classes.value(), metric, suspicion);
  if (!flags.ok()) return flags.status();
  for (const analyzer::CommClass& c : classes.value().classes) {
    std::vector<std::uint64_t> ids;
    for (std::size_t i : c.comms) ids.push_back(comms[i].id);
    v.classes.push_back(std::move(ids));
  }
  std::set<std::size_t> suspicious_classes;
  for (const analyzer::CommAssessment& a : flags.value()) {
    if (a.verdict == analyzer::CommVerdict::kSuspicious) {
      v.suspicious.push_back(comms[a.comm].id);
      suspicious_classes.insert(a.class_index);
    }
    v.evidence.push_back({{"comm", protocol::CommIdHex(comms[a.comm].id)},
                          {"nranks", comms[a.comm].nranks},
                          {"class", a.class_index == analyzer::kNoClass ? -1 : static_cast<long>(a.class_index)},
                          {"verdict", VerdictName(a.verdict)},
                          {"metric_s", std::isfinite(a.metric) ? a.metric : 0.0},
                          {"baseline_s", a.baseline},
                          {"ratio", a.ratio}});
  }
  for (const analyzer::CommAssessment& a : flags.value()) {
    if (a.verdict == analyzer::CommVerdict::kHealthy && suspicious_classes.count(a.class_index)) {
      v.peers.push_back(comms[a.comm].id);
    }
  }
  for (const auto& [id, r] : reports) {
    if (std::optional<ComputeSuspectFinding> s = SuspectIn(id, r, view)) v.compute_suspects.push_back(*s);
  }
  return v;
}

double ProfileNumber(const json& o, const char* key) {
  auto it = o.find(key);
  return it != o.end() && it->is_number() ? it->get<double>() : kNaN;
}

}  // namespace falcon::controller
