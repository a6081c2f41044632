// CommProfiler: per-communicator call profile of one rank over a window — for each
// (communicator, op, bytes, peer) signature: how many calls and, for calls with a host end time
// (profile / sample mode), mean and median host duration. The controller compares these across
// ranks to find the communicators that are slower than their peers.
// Memory: at most `max_signatures` signatures (further ones are counted in overflow()), each with
// a reservoir of the last kReservoir durations.
// Thread-safety: plain value object, one owner. Must never: do I/O or read clocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "falcon/shm_abi.h"

namespace falcon::agent {

struct SignatureStats {
  std::string op;
  std::uint64_t bytes = 0;
  std::int32_t peer = -1;
  std::uint64_t count = 0;
  std::uint64_t timed = 0;  // calls with a duration
  double mean_us = 0;       // of timed calls
  double median_us = 0;     // of the reservoir (last kReservoir timed calls)
};

struct CommStats {
  std::uint64_t id = 0;
  std::int32_t rank = -1;
  std::int32_t nranks = 0;
  std::vector<SignatureStats> sigs;
};

class CommProfiler {
 public:
  static constexpr std::size_t kReservoir = 64;
  explicit CommProfiler(std::size_t max_signatures = 4096) : max_signatures_(max_signatures) {}

  // One record on communicator `comm` (a consistent copy of its table entry). Records that are
  // not collective or point-to-point calls are ignored.
  void Add(const FalconRecord& r, const FalconCommEntry& comm);
  // The window's profile, and a fresh window.
  std::vector<CommStats> TakeWindow();
  bool empty() const { return sigs_.empty(); }
  std::uint64_t overflow() const { return overflow_; }

 private:
  struct Key {
    std::uint64_t comm;
    std::uint8_t op;
    std::uint64_t bytes;
    std::int32_t peer;
    bool operator<(const Key& o) const {
      return std::tie(comm, op, bytes, peer) < std::tie(o.comm, o.op, o.bytes, o.peer);
    }
  };
  struct Acc {
    std::uint64_t count = 0;
    std::uint64_t timed = 0;
    double sum_us = 0;
    std::vector<double> reservoir;  // ring of the last kReservoir durations
    std::size_t next = 0;
  };
  struct CommId {
    std::int32_t rank = -1;
    std::int32_t nranks = 0;
  };

  std::size_t max_signatures_;
  std::map<Key, Acc> sigs_;
  std::map<std::uint64_t, CommId> comms_;
  std::uint64_t overflow_ = 0;
};

}  // namespace falcon::agent
