// TrackingStage. See tracking_stage.h for the contract.
#include "daemon/controller/tracking_stage.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>

#include "analyzer/robust.h"

namespace falcon::controller {

std::optional<SlowRank> TrackingStage::OnAlarm(const nlohmann::json& m) {
  const std::int64_t rank = m["rank"].get<std::int64_t>();
  if (rank < 0) return std::nullopt;
  ++slow_version_;
  if (m["kind"] != "slow") {
    slow_.erase(rank);
    return std::nullopt;
  }
  const SlowRank s{m["ratio"].get<double>(), m["level_s"].get<double>(), m["baseline_s"].get<double>(),
                   m.value("onset_ns", m["at_ns"].get<std::int64_t>())};
  slow_[rank] = s;
  return s;
}

void TrackingStage::OnIterations(const nlohmann::json& m) {
  const std::int64_t rank = m["rank"].get<std::int64_t>();
  if (rank < 0) return;
  auto it = recent_.find(rank);
  const bool had = it != recent_.end();
  if (!had) it = recent_.emplace(rank, Recent{}).first;
  Recent& r = it->second;
  for (const nlohmann::json& s : m["seconds"]) {
    if (!s.is_number()) continue;
    r.samples.push_back(s.get<double>());
    if (r.samples.size() > kRecentIterations) r.samples.pop_front();
  }
  if (r.samples.empty()) {  // nothing numeric: as before, an empty record ranks nowhere
    if (!had) recent_.erase(it);
    return;
  }
  if (had) {  // its entries in the orderings are its old medians
    for (auto& [last, ordered] : by_median_) ordered.erase({r.median[last], rank});
  }
  std::array<double, kRecentIterations> newest{};  // newest first
  const std::size_t have = r.samples.size();
  std::copy(r.samples.rbegin(), r.samples.rend(), newest.begin());
  std::vector<double> scratch;
  scratch.reserve(kRecentIterations);
  for (std::size_t n = 1; n <= kRecentIterations; ++n) {
    r.median[n] = analyzer::Median(std::span<const double>(newest.data(), std::min(n, have)), scratch);
  }
  for (auto& [last, ordered] : by_median_) ordered.insert({r.median[last], rank});
}

TrackingStage::Ordered& TrackingStage::OrderedFor(std::size_t last) const {
  auto it = by_median_.find(last);
  if (it != by_median_.end()) return it->second;
  Ordered& ordered = by_median_[last];
  for (const auto& [rank, r] : recent_) ordered.insert({r.median[last], rank});
  return ordered;
}

const std::vector<std::int64_t>& TrackingStage::LiveSlow(const JobView& view) const {
  if (live_slow_.slow_version == slow_version_ && live_slow_.view_version == view.version() &&
      view.version() != 0) {
    return live_slow_.ranks;
  }
  live_slow_.ranks.clear();
  for (const auto& [rank, s] : slow_) {
    if (view.ranks().count(rank)) live_slow_.ranks.push_back(rank);
  }
  live_slow_.slow_version = slow_version_;
  live_slow_.view_version = view.version();
  return live_slow_.ranks;
}

std::vector<std::int64_t> TrackingStage::Outbreak(const JobView& view, double min_fraction,
                                                  std::int64_t stale_before_ns) const {
  std::vector<std::int64_t> slow = LiveSlow(view);
  if (stale_before_ns > 0) {
    std::erase_if(slow, [&](std::int64_t r) { return slow_.at(r).onset_ns <= stale_before_ns; });
  }
  if (slow.empty()) return slow;
  const double fraction = static_cast<double>(slow.size()) / static_cast<double>(view.ranks().size());
  if (fraction < min_fraction) slow.clear();
  return slow;
}

std::optional<double> TrackingStage::CurrentIterationS(const JobView& view, std::size_t last) const {
  last = std::clamp<std::size_t>(last, 1, kRecentIterations);
  const Ordered& ordered = OrderedFor(last);
  for (auto it = ordered.rbegin(); it != ordered.rend(); ++it) {
    if (view.ranks().count(it->second)) return it->first;  // the worst live rank
  }
  return std::nullopt;
}

}  // namespace falcon::controller
