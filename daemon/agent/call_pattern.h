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
//
// Channels: per communicator slot the log counts every ordered call since the communicator's
// first (comm_seq 0) per channel: its collectives (and init, split, finalize), and its sends to
// and receives from each peer. A communicator's counts are known only while its comm_seqs came
// without a gap from 0: an agent that started after the communicator, or lost records, reports it
// without channels, and the controller counts it by its totals.
// Memory: at most `capacity` calls (48 bytes each), and one counter per channel. Cost: Push
// O(log peers); Build O(period + the calls since it + channels).
// Thread-safety: plain value object, one owner (the agent loop). Must never: do I/O or throw.
#pragma once

#include <boost/circular_buffer.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
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
  std::uint64_t calls = 0;            // ordered calls issued so far (FalconCommEntry::calls)
  std::uint32_t slot = FALCON_NO_COMM;  // its comm table slot: the records' comm_slot
  std::int32_t rank = -1;             // the rank's comm rank in it
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

  // One record of the rank, in time order across lanes (SegmentReader::Read's merge), every one
  // the agent reads (records the rank lost leave a gap in comm_seq). `comm_id`: the
  // communicator's id (0 if none or not known yet).
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
    std::uint64_t channel_seq = kUnknown;  // calls on its channel before it
    std::int32_t peer = -1;                // send/recv: the peer's comm rank
    analyzer::ChannelKind kind = analyzer::ChannelKind::kCollective;
  };
  static constexpr std::uint64_t kUnknown = ~std::uint64_t{0};
  // One communicator slot's channel counts since its comm_seq 0.
  struct Channels {
    bool known = false;  // every comm_seq from 0 came, in order
    std::uint64_t next = 0;
    std::uint64_t collectives = 0;
    std::map<std::int32_t, std::uint64_t> sends, recvs;  // per peer
    std::uint64_t& Of(analyzer::ChannelKind kind, std::int32_t peer);
  };
  // The record's channel count before it, or kUnknown.
  std::uint64_t CountChannel(const FalconRecord& r, analyzer::ChannelKind kind);

  // Every lane's, oldest first; a ring of `capacity` (a deque would allocate and free a block
  // every few calls).
  boost::circular_buffer<Call> calls_;
  std::unordered_map<int, std::uint32_t> group_ordinal_;  // per lane: outermost groups begun
  std::unordered_map<std::uint32_t, Channels> channels_;   // per comm slot
  std::int64_t anchor_ns_ = 0;
  std::uint64_t anchor_index_ = 0;
};

}  // namespace falcon::agent
