// The rank key / beat split (rank_beat.h).
#include "daemon/protocol/rank_beat.h"

#include <algorithm>
#include <utility>

namespace falcon::protocol {

using nlohmann::json;

RankBeat BeatOf(const RankRegistration& m, std::int64_t written_ns) {
  RankBeat b;
  b.rank = m.rank;
  b.written_ns = written_ns;
  b.calls.reserve(m.comms.size());
  for (const CommSummary& c : m.comms) b.calls.push_back(c.calls);
  b.records = m.records;
  b.lost = m.lost;
  b.iterations = m.iterations;
  b.excluded = m.excluded;
  return b;
}

bool RankKeyWriter::SameContent(const RankRegistration& m) {
  if (m.comms.size() != content_.comms.size()) return false;
  content_.header.at_ns = m.header.at_ns;
  for (std::size_t i = 0; i < m.comms.size(); ++i) content_.comms[i].calls = m.comms[i].calls;
  content_.records = m.records;
  content_.lost = m.lost;
  content_.iterations = m.iterations;
  content_.excluded = m.excluded;
  return content_ == m;
}

bool RankKeyWriter::Next(const RankRegistration& m, std::int64_t now_ns, std::int64_t ttl_ns,
                         std::int64_t heartbeat_ns, RankBeat& beat) {
  bool write = false;
  if (payload_.empty() || !SameContent(m)) {
    content_ = m;
    payload_ = ToJson(m).dump();
    written_ns_ = m.header.at_ns;
    write = true;
  } else if (now_ns - last_write_ns_ + 2 * heartbeat_ns >= ttl_ns) {
    write = true;  // the same text: readers holding it need not read it again
  }
  if (write) last_write_ns_ = now_ns;
  beat = BeatOf(m, written_ns_);
  return write;
}

bool ApplyBeat(json& registration, const json& beat, const std::string& host, std::int64_t at_ns) {
  if (registration.value("host", std::string()) != host) return false;
  if (registration["rank"] != beat["rank"] || registration["at_ns"] != beat["written_ns"]) return false;
  json& comms = registration["comms"];
  const json& calls = beat["calls"];
  if (comms.size() != calls.size()) return false;
  for (std::size_t i = 0; i < comms.size(); ++i) comms[i]["calls"] = calls[i];
  for (const char* field : {"records", "lost", "iterations"}) registration[field] = beat[field];
  if (beat.contains("excluded")) {
    registration["excluded"] = beat["excluded"];
  } else {
    registration.erase("excluded");
  }
  registration["at_ns"] = at_ns;
  return true;
}

BeatIndex::BeatIndex(const std::vector<json>& agents) {
  std::vector<std::pair<std::int64_t, Beat>> by_rank;
  for (const json& a : agents) {
    auto it = a.find("beats");
    if (it == a.end()) continue;
    const std::string* host = &a["host"].get_ref<const std::string&>();
    const std::int64_t at_ns = a["at_ns"].get<std::int64_t>();
    for (const json& b : *it) by_rank.push_back({b["rank"].get<std::int64_t>(), Beat{&b, host, at_ns}});
  }
  std::stable_sort(by_rank.begin(), by_rank.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  ranks_.reserve(by_rank.size());
  beats_.reserve(by_rank.size());
  for (const auto& [rank, b] : by_rank) {
    ranks_.push_back(rank);
    beats_.push_back(b);
  }
}

std::span<const BeatIndex::Beat> BeatIndex::Of(std::int64_t rank) const {
  const auto [lo, hi] = std::equal_range(ranks_.begin(), ranks_.end(), rank);
  return {beats_.data() + (lo - ranks_.begin()), static_cast<std::size_t>(hi - lo)};
}

void ApplyBeats(std::vector<json>& ranks, const std::vector<json>& agents) {
  const BeatIndex index(agents);
  for (json& r : ranks) {
    for (const BeatIndex::Beat& b : index.Of(r["rank"].get<std::int64_t>())) {
      if (ApplyBeat(r, *b.beat, *b.host, b.at_ns)) break;
    }
  }
}

}  // namespace falcon::protocol
