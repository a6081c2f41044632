// The rank keys' contents held between view re-reads (rank_key_cache.h).
#include "daemon/controller/rank_key_cache.h"

#include <algorithm>
#include <set>

namespace falcon::controller {

using nlohmann::json;

namespace {

// The held entry with the counters of `b`, when they fit it (one per communicator of its key).
std::optional<RankEntry> WithBeat(const RankEntry& held, const std::vector<std::uint32_t>& slots, std::size_t comms,
                                  const protocol::BeatIndex::Beat& b) {
  const json& calls = (*b.beat)["calls"];
  if (calls.size() != comms) return std::nullopt;
  RankEntry e = held;
  for (std::size_t k = 0; k < e.info.comms.size(); ++k) e.info.comms[k].calls = calls[slots[k]].get<std::uint64_t>();
  e.info.at_ns = b.at_ns;
  return e;
}

}  // namespace

void RankKeyCache::SetAgents(const std::vector<json>& agents) { beats_ = protocol::BeatIndex(agents); }

const RankKeyCache::Held* RankKeyCache::Matching(std::int64_t rank, const protocol::BeatIndex::Beat& b) const {
  auto it = held_.find({rank, *b.host});
  if (it == held_.end() || (*b.beat)["written_ns"] != it->second.written_ns) return nullptr;
  return &it->second;
}

bool RankKeyCache::NeedsFetch(std::optional<std::int64_t> rank) const {
  if (!rank) return true;
  const auto beats = beats_.Of(*rank);
  if (beats.empty()) return true;  // nobody beats for it: its key is all there is
  return std::any_of(beats.begin(), beats.end(), [&](const auto& b) { return Matching(*rank, b) == nullptr; });
}

void RankKeyCache::Fetched(const json& registration) {
  Held h;
  h.entry = ParseRankEntry(registration, &h.slots);
  h.comms = registration["comms"].size();
  h.written_ns = registration["at_ns"].get<std::int64_t>();
  h.fetched_now = true;
  std::string host = h.entry.info.host;
  held_[{h.entry.info.rank, std::move(host)}] = std::move(h);
}

std::vector<RankEntry> RankKeyCache::Registrations(const std::vector<std::int64_t>& ranks) {
  std::set<std::int64_t> live(ranks.begin(), ranks.end());
  for (const auto& [key, h] : held_) {
    if (h.fetched_now) live.insert(key.first);
  }
  std::vector<RankEntry> out;
  out.reserve(live.size());
  std::vector<const Held*> unfit;  // named by a beat whose counters do not fit them
  for (const std::int64_t rank : live) {
    const std::size_t given = out.size();
    unfit.clear();
    for (const protocol::BeatIndex::Beat& b : beats_.Of(rank)) {
      const Held* h = Matching(rank, b);
      if (h == nullptr) continue;
      if (std::optional<RankEntry> e = WithBeat(h->entry, h->slots, h->comms, b)) {
        out.push_back(std::move(*e));
      } else {
        unfit.push_back(h);
      }
    }
    if (out.size() != given) continue;
    // No beat goes with what its key holds now: the content as it was fetched; or, where a beat
    // named the held content but its counters do not fit it (another number of communicators:
    // not from an agent), the content as it is held.
    for (auto h = held_.lower_bound({rank, std::string()}); h != held_.end() && h->first.first == rank; ++h) {
      if (h->second.fetched_now) out.push_back(h->second.entry);
    }
    if (out.size() != given) continue;
    for (const Held* h : unfit) out.push_back(h->entry);
  }
  // Kept: what a beat still names (a claimant whose content the key holds now and then), and
  // the contents just fetched, whose beat may come with the next heartbeat.
  for (auto it = held_.begin(); it != held_.end();) {
    const auto beats = beats_.Of(it->first.first);
    const bool beating =
        std::any_of(beats.begin(), beats.end(), [&](const auto& b) { return *b.host == it->first.second; });
    if (!live.count(it->first.first) || (!beating && !it->second.fetched_now)) {
      it = held_.erase(it);
      continue;
    }
    it->second.fetched_now = false;
    ++it;
  }
  beats_ = {};
  return out;
}

void RankKeyCache::Abandon() {
  for (auto& [key, h] : held_) h.fetched_now = false;
  beats_ = {};
}

}  // namespace falcon::controller
