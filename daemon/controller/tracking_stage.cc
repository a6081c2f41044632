// TrackingStage. See tracking_stage.h for the contract.
#include "daemon/controller/tracking_stage.h"

#include <algorithm>
#include <cstddef>

#include "analyzer/robust.h"

namespace falcon::controller {

std::optional<SlowRank> TrackingStage::OnAlarm(const nlohmann::json& m) {
  const std::int64_t rank = m["rank"].get<std::int64_t>();
  if (rank < 0) return std::nullopt;
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
  std::deque<double>& q = recent_[rank];
  for (const nlohmann::json& s : m["seconds"]) {
    if (!s.is_number()) continue;
    q.push_back(s.get<double>());
    if (q.size() > kRecentIterations) q.pop_front();
  }
}

std::vector<std::int64_t> TrackingStage::LiveSlow(const JobView& view) const {
  std::vector<std::int64_t> out;
  for (const auto& [rank, s] : slow_) {
    if (view.ranks().count(rank)) out.push_back(rank);
  }
  return out;
}

std::vector<std::int64_t> TrackingStage::Outbreak(const JobView& view, double min_fraction) const {
  std::vector<std::int64_t> slow = LiveSlow(view);
  if (slow.empty()) return slow;
  const double fraction = static_cast<double>(slow.size()) / static_cast<double>(view.ranks().size());
  if (fraction < min_fraction) slow.clear();
  return slow;
}

std::optional<double> TrackingStage::CurrentIterationS(const JobView& view, std::size_t last) const {
  std::optional<double> worst;
  std::vector<double> scratch;
  last = std::clamp<std::size_t>(last, 1, kRecentIterations);
  for (const auto& [rank, q] : recent_) {
    if (q.empty() || !view.ranks().count(rank)) continue;
    const std::vector<double> v(q.end() - static_cast<std::ptrdiff_t>(std::min(last, q.size())), q.end());
    const double m = analyzer::Median(v, scratch);
    if (!worst || m > *worst) worst = m;
  }
  return worst;
}

}  // namespace falcon::controller
