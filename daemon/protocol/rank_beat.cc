// The rank key / beat split (rank_beat.h).
#include "daemon/protocol/rank_beat.h"

#include <map>
#include <utility>

namespace falcon::protocol {
namespace {

using nlohmann::json;

// m's content: its text with the counters and the write time zeroed.
std::string Content(RankRegistration m) {
  m.header.at_ns = 0;
  for (CommSummary& c : m.comms) c.calls = 0;
  m.records = m.lost = m.iterations = m.excluded = 0;
  return ToJson(m).dump();
}

}  // namespace

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

bool RankKeyWriter::Next(const RankRegistration& m, std::int64_t now_ns, std::int64_t ttl_ns,
                         std::int64_t heartbeat_ns, RankBeat& beat) {
  std::string content = Content(m);
  bool write = false;
  if (!written_ || content != content_) {
    content_ = std::move(content);
    payload_ = ToJson(m).dump();
    written_ns_ = m.header.at_ns;
    written_ = true;
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

void ApplyBeats(std::vector<json>& ranks, const std::vector<json>& agents) {
  std::multimap<std::int64_t, std::pair<const json*, const json*>> beats;  // rank -> (heartbeat, beat)
  for (const json& a : agents) {
    auto it = a.find("beats");
    if (it == a.end()) continue;
    for (const json& b : *it) beats.emplace(b["rank"].get<std::int64_t>(), std::pair{&a, &b});
  }
  for (json& r : ranks) {
    auto [from, to] = beats.equal_range(r["rank"].get<std::int64_t>());
    for (auto it = from; it != to; ++it) {
      const auto [a, b] = it->second;
      if (ApplyBeat(r, *b, (*a)["host"].get<std::string>(), (*a)["at_ns"].get<std::int64_t>())) break;
    }
  }
}

}  // namespace falcon::protocol
