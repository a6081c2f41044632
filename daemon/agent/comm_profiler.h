// CommProfiler: per-communicator call profile of one rank over a window — for each
// (communicator, op, bytes, peer) signature: how many calls and, for timed calls (profile /
// sample mode), mean and median duration. The controller compares these across ranks to find
// the communicators that are slower than their peers.
// Durations are DEVICE time where the shim timed the call with CUDA events: on a GPU a call
// returns once its work is enqueued, so its host duration says nothing about the transfer. Such
// a call's record carries kFalconFlagGpuPending and its device time follows in a
// kFalconOpGpuTiming record (Observe), matched by (lane, index); calls inside an NCCL group are
// timed as one by the group end's timing, which every profiled call of the group gets. Host
// durations count only for calls that will get no device time (no GPU: there the host time is
// the call's duration).
// Memory: at most `max_signatures` signatures (further ones are counted in overflow()), each with
// a reservoir of the last kReservoir durations; at most kMaxPending calls awaiting their device
// time (the oldest are dropped).
// Thread-safety: plain value object, one owner. Must never: do I/O or read clocks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "falcon/shm_abi.h"

namespace falcon::agent {

struct SignatureStats {
  std::string op;
  std::uint64_t bytes = 0;
  std::int32_t peer = -1;
  std::uint64_t count = 0;
  std::uint64_t timed = 0;  // calls with a duration
  std::uint64_t device = 0; // of which device durations (CUDA events)
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

  static constexpr std::size_t kMaxPending = 65536;

  // One record on communicator `comm` (a consistent copy of its table entry). Records that are
  // not collective or point-to-point calls are ignored.
  void Add(const FalconRecord& r, const FalconCommEntry& comm);
  // A record without a communicator: group ends (a timed group) and GPU timing records.
  void Observe(const FalconRecord& r);
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
    bool operator==(const Key& o) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const {
      std::uint64_t x = k.comm ^ (k.bytes * 0x9E3779B97F4A7C15ULL) ^
                        (std::uint64_t{k.op} << 56) ^ (std::uint64_t{static_cast<std::uint32_t>(k.peer)} << 20);
      x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ULL;
      return static_cast<std::size_t>(x ^ (x >> 29));
    }
  };
  struct Acc {
    std::uint64_t count = 0;
    std::uint64_t timed = 0;
    std::uint64_t device = 0;
    double sum_us = 0;
    std::vector<double> reservoir;  // ring of the last kReservoir durations
    std::size_t next = 0;
  };
  struct CommId {
    std::int32_t rank = -1;
    std::int32_t nranks = 0;
  };

  void AddDuration(const Key& key, double us, bool device);
  // The window's entry of `key`, added (and *added set) when new; nullptr when the window is
  // full (counted in overflow_). Through a direct-mapped cache: a rank has few signatures.
  Acc* Lookup(const Key& key, bool* added);

  std::size_t max_signatures_;
  std::unordered_map<Key, Acc, KeyHash> sigs_;  // a lookup per call; ordered at TakeWindow
  struct Cached {
    Key key{};
    Acc* acc = nullptr;  // into sigs_ (node-based: stable until cleared)
  };
  std::array<Cached, 64> cache_{};
  // Calls awaiting their device time: (lane, index in lane) -> the signatures it times (one
  // call, or every profiled call of a group), in arrival order for dropping the oldest.
  std::map<std::pair<std::uint8_t, std::uint64_t>, std::vector<Key>> pending_;
  std::vector<Key> open_group_[256];  // per lane: profiled calls of the group being issued
  std::map<std::uint64_t, CommId> comms_;
  std::uint64_t overflow_ = 0;
};

}  // namespace falcon::agent
