// CallPatternLog: a rank's recent ordered calls (collectives and send/recv, with their
// communicator, comm_seq and group), from which the agent answers `cut_info`: one period of the
// rank's calls as analyzer::RankCallPattern units, its progress since, and its pace — what the
// controller's PlanCut needs to stop every rank at a consistent cut without a world collective.
//
// Calls come from the rank's own records, every lane merged in time order: a PyTorch job issues
// its forward collectives from the training thread and its backward ones (tensor-parallel
// all-reduces, data-parallel gradient hooks) from the autograd engine's device thread, so a
// rank's ordered calls come from two threads that take turns (seen on a GPU: dropping calls of
// the "other" lane left 4 calls where two periods of 28 were needed). Polls and other queries
// are never ordered and never recorded (shm_abi.h). Groups are told apart by (lane, the lane's
// outermost ncclGroupStart ordinal).
// Memory: at most `capacity` calls (24 bytes each). Cost: Push O(1); Build O(period).
// Thread-safety: plain value object, one owner (the agent loop). Must never: do I/O or throw.
#pragma once

#include <boost/circular_buffer.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>

#include "analyzer/cut_plan.h"
#include "falcon/shm_abi.h"
#include "falcon/status.h"

namespace falcon::agent {

struct PatternCommInfo {
  std::uint64_t id = 0;
  std::int64_t nranks = 0;
  std::uint64_t calls = 0;  // ordered calls issued so far (FalconCommEntry::calls)
};

struct CallPatternReport {
  analyzer::RankCallPattern pattern;  // min_position left 0: the controller adds its lead
  std::uint64_t position = 0;         // units issued since the pattern's start, as of the last call
  double units_per_s = 0;             // pace over the pattern's period
  std::int64_t last_call_ns = 0;      // the records' clock (CLOCK_MONOTONIC) of the last call
};

class CallPatternLog {
 public:
  explicit CallPatternLog(std::size_t capacity = 1 << 16) : calls_(capacity) {}

  // One record of the rank, in time order across lanes (SegmentReader::Read's merge). `comm_id`:
  // the communicator's id (0 if none).
  void Push(const FalconRecord& r, std::uint64_t comm_id);
  // The latest iteration sample's anchor (its first call's t_start_ns) and index.
  void SetIteration(std::int64_t anchor_ns, std::uint64_t index) {
    anchor_ns_ = anchor_ns;
    anchor_index_ = index;
  }

  // One period of `period` calls ending at the last complete unit, aligned to the latest
  // iteration anchor when it is still held. `comms`: every live communicator of the rank.
  // Unavailable (with the reason) when fewer than two periods are held, the calls are not
  // periodic with that period, or period is 0.
  Result<CallPatternReport> Build(std::size_t period, std::span<const PatternCommInfo> comms) const;

  std::size_t size() const { return calls_.size(); }

 private:
  struct Call {
    std::uint64_t comm = 0;
    std::uint64_t seq = 0;
    std::int64_t t_ns = 0;
    std::uint64_t group = 0;  // 0: outside a group; else (lane + 1) << 32 | the lane's group ordinal
  };

  // Every lane's, oldest first; a ring of `capacity` (a deque would allocate and free a block
  // every few calls).
  boost::circular_buffer<Call> calls_;
  std::unordered_map<int, std::uint32_t> group_ordinal_;  // per lane: outermost groups begun
  std::int64_t anchor_ns_ = 0;
  std::uint64_t anchor_index_ = 0;
};

}  // namespace falcon::agent
