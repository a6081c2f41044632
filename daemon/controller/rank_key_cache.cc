// The rank keys' contents held between view re-reads (rank_key_cache.h).
#include "daemon/controller/rank_key_cache.h"

#include <set>

#include "daemon/protocol/rank_beat.h"

namespace falcon::controller {

using nlohmann::json;

void RankKeyCache::SetAgents(const std::vector<json>& agents) {
  beats_.clear();
  for (const json& a : agents) {
    auto it = a.find("beats");
    if (it == a.end()) continue;
    const std::string host = a["host"].get<std::string>();
    const std::int64_t at_ns = a["at_ns"].get<std::int64_t>();
    for (const json& b : *it) beats_.emplace(b["rank"].get<std::int64_t>(), Beat{&b, host, at_ns});
  }
}

const RankKeyCache::Held* RankKeyCache::Matching(std::int64_t rank, const Beat& b) const {
  auto it = held_.find({rank, b.host});
  if (it == held_.end() || it->second.registration["at_ns"] != (*b.beat)["written_ns"]) return nullptr;
  return &it->second;
}

bool RankKeyCache::NeedsFetch(std::optional<std::int64_t> rank) const {
  if (!rank) return true;
  auto [from, to] = beats_.equal_range(*rank);
  if (from == to) return true;  // nobody beats for it: its key is all there is
  for (auto it = from; it != to; ++it) {
    if (Matching(*rank, it->second) == nullptr) return true;
  }
  return false;
}

void RankKeyCache::Fetched(json registration) {
  const std::int64_t rank = registration["rank"].get<std::int64_t>();
  std::string host = registration["host"].get<std::string>();
  held_[{rank, std::move(host)}] = Held{std::move(registration), true};
}

std::vector<json> RankKeyCache::Registrations(const std::vector<std::int64_t>& ranks) {
  std::set<std::int64_t> live(ranks.begin(), ranks.end());
  for (const auto& [key, h] : held_) {
    if (h.fetched_now) live.insert(key.first);
  }
  std::vector<json> out;
  for (const std::int64_t rank : live) {
    bool merged = false;
    auto [from, to] = beats_.equal_range(rank);
    for (auto it = from; it != to; ++it) {
      const Held* h = Matching(rank, it->second);
      if (h == nullptr) continue;
      json r = h->registration;
      if (protocol::ApplyBeat(r, *it->second.beat, it->second.host, it->second.at_ns)) {
        out.push_back(std::move(r));
        merged = true;
      }
    }
    if (merged) continue;
    // No beat goes with what its key holds now: the content as it was fetched; or, where a beat
    // named the held content but its counters do not fit it (another number of communicators:
    // not from an agent), the content as it is held.
    const std::size_t given = out.size();
    for (auto h = held_.lower_bound({rank, std::string()}); h != held_.end() && h->first.first == rank; ++h) {
      if (h->second.fetched_now) out.push_back(h->second.registration);
    }
    if (out.size() != given) continue;
    for (auto it = from; it != to; ++it) {
      if (const Held* h = Matching(rank, it->second)) out.push_back(h->registration);
    }
  }
  // Kept: what a beat still names (a claimant whose content the key holds now and then), and
  // the contents just fetched, whose beat may come with the next heartbeat.
  for (auto it = held_.begin(); it != held_.end();) {
    const bool beating = [&] {
      auto [from, to] = beats_.equal_range(it->first.first);
      for (auto b = from; b != to; ++b) {
        if (b->second.host == it->first.second) return true;
      }
      return false;
    }();
    if (!live.count(it->first.first) || (!beating && !it->second.fetched_now)) {
      it = held_.erase(it);
      continue;
    }
    it->second.fetched_now = false;
    ++it;
  }
  beats_.clear();
  return out;
}

void RankKeyCache::Abandon() {
  for (auto& [key, h] : held_) h.fetched_now = false;
  beats_.clear();
}

}  // namespace falcon::controller
