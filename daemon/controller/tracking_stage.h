// TrackingStage: the controller's tracking stage (docs/controller.md "What it does", Tracking).
// Which ranks are slow, by the last alarm each rank's agent sent, and how long the job's
// iterations take now, from the iteration times the agents report.
//
//  - A rank is slow from its `slow` alarm until an `ok` one. The reports are persisted with the
//    controller's state (ControllerState::slow), so the stage keeps them in the map it is given
//    and a restarted controller replays the alarms stream into it.
//  - Only live ranks count (the view's): a rank that exited or whose agent stopped reporting
//    neither keeps an incident open nor opens one.
//  - The job's iteration time is the worst over the live ranks of the median of each rank's
//    last kRecentIterations reported iterations. The controller asks for it several times a
//    turn (its phases, metrics and state): each rank's medians are kept as its reports arrive,
//    ordered by value, so a question costs the live ranks it skips at the top, not the job (at
//    16,384 ranks a scan of every rank took milliseconds, each time).
//  - An outbreak is at least `min_fraction` of the live ranks slow at once: in synchronous
//    training a real fail-slow slows every rank within a few iterations, a lone alarm is noise.
// Thread-safety: a value type for one thread (the controller loop). Must never: do I/O, read a
// clock, or trust a message it was not given validated.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "daemon/controller/controller_state.h"
#include "daemon/controller/job_view.h"

namespace falcon::controller {

class TrackingStage {
 public:
  static constexpr std::size_t kRecentIterations = 8;  // kept per rank

  // `slow`: where the slow-rank reports live (persisted by the caller); must outlive the stage.
  explicit TrackingStage(std::map<std::int64_t, SlowRank>& slow) : slow_(slow) {}

  // A validated `alarm`. A `slow` one is kept (the rank's last report wins) and returned, for
  // the caller's incident; an `ok` one clears the rank and returns nothing.
  std::optional<SlowRank> OnAlarm(const nlohmann::json& m);
  // A validated `iterations` message: its samples, the last kRecentIterations kept.
  void OnIterations(const nlohmann::json& m);

  // The live ranks that are slow, ascending. Kept until an alarm changes the slow ranks or the
  // view is updated (asked every turn: at 16,384 ranks slow, a scan took milliseconds).
  [[nodiscard]] const std::vector<std::int64_t>& LiveSlow(const JobView& view) const;
  // The slow-rank map was replaced from outside (a restored state): forget what was kept.
  void Reload() { ++slow_version_; }
  // Changes whenever the slow-rank map does (alarms, Reload).
  [[nodiscard]] std::uint64_t slow_version() const { return slow_version_; }
  // The live slow ranks whose slowdown began after `stale_before_ns`, when they are at least
  // `min_fraction` of the live ranks; else none.
  [[nodiscard]] std::vector<std::int64_t> Outbreak(const JobView& view, double min_fraction,
                                                   std::int64_t stale_before_ns = 0) const;
  // The job's iteration time now, s, from each rank's `last` (1..kRecentIterations) iterations:
  // the default is steady, fewer follow a change sooner. None before any live rank reported one.
  [[nodiscard]] std::optional<double> CurrentIterationS(const JobView& view,
                                                        std::size_t last = kRecentIterations) const;

 private:
  struct Recent {
    std::deque<double> samples;                        // the last kRecentIterations
    std::array<double, kRecentIterations + 1> median{};  // [n]: of the last n samples (n >= 1)
  };
  using Ordered = std::set<std::pair<double, std::int64_t>>;  // (median, rank), ascending
  // The ordering of the ranks' medians over `last` samples, built on its first question and
  // kept as reports arrive (a value type for one thread: questions may build it).
  Ordered& OrderedFor(std::size_t last) const;

  std::map<std::int64_t, SlowRank>& slow_;
  std::uint64_t slow_version_ = 1;  // changes with slow_
  struct LiveSlowKept {
    std::uint64_t slow_version = 0, view_version = 0;  // what it was computed from; 0: nothing
    std::vector<std::int64_t> ranks;
  };
  mutable LiveSlowKept live_slow_;
  std::map<std::int64_t, Recent> recent_;  // per rank with at least one sample
  mutable std::map<std::size_t, Ordered> by_median_;  // per `last` asked for
};

}  // namespace falcon::controller
