// Call signatures: what makes two NCCL calls "the same call" for period detection (FALCON §4.2).
// A signature is (op, communicator, size class, peer/root); management calls (Comm*, Group*,
// GetUniqueId, queries, registration) form no signature of their own: they do not repeat with the
// training step in a reliable way (group brackets wrap the P2P calls, which already carry the
// pattern) and would only add noise. Timing fields ride along untouched.
// Thread-safety: SignatureTable is a plain value object (no internal locking); the free functions
// are stateless.
// Must never: do I/O, read clocks or globals, throw for unknown op names (they map to kOther).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace falcon::analyzer {

enum class OpKind : std::uint8_t {
  kOther = 0,  // an unknown or management call: never forms a signature
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kGather,
  kScatter,
  kSend,
  kRecv,
};

// Maps an NCCL function name ("AllReduce", "ncclAllReduce", "Bcast", ...) to its kind.
// Management and query calls ("CommInitRank", "GroupStart", "GetUniqueId", ...) map to kOther.
[[nodiscard]] OpKind ParseOpKind(std::string_view name);

// One recorded call as the analyzer sees it. comm is the 64-bit communicator id (0 = none);
// bytes is count x element size (0 when not applicable); peer is the peer or root (-1 = none);
// t_ns is the host enqueue time in CLOCK_MONOTONIC nanoseconds.
struct CallRecord {
  OpKind op = OpKind::kOther;
  std::uint64_t comm = 0;
  std::uint64_t bytes = 0;
  std::int32_t peer = -1;
  std::int64_t t_ns = 0;
};

// Size class: 0 for 0 bytes, else 1 + floor(log2(bytes)). Sizes within a factor of two share a
// class, so padding or dtype-preserving reshapes do not split a signature.
[[nodiscard]] std::uint32_t SizeClass(std::uint64_t bytes);

// 64-bit hash of (op, comm, size class, peer). REQUIRES: op != kOther.
[[nodiscard]] std::uint64_t SignatureHash(const CallRecord& call);

// Assigns dense small ids (0, 1, 2, ...) to signature hashes in order of first appearance, so the
// period detector works on compact symbols. Memory grows with the number of distinct signatures.
class SignatureTable {
 public:
  // Returns the id of `hash`, adding it when new.
  std::uint32_t Intern(std::uint64_t hash);
  [[nodiscard]] std::size_t size() const { return ids_.size(); }

 private:
  // A direct-mapped cache in front of the map (hashes are mixed already): a job has few
  // signatures, and Intern runs once per call.
  struct Slot {
    std::uint64_t hash = 0;
    std::uint32_t id = 0;
    bool used = false;
  };
  static constexpr std::size_t kCacheSlots = 64;
  std::array<Slot, kCacheSlots> cache_{};
  std::unordered_map<std::uint64_t, std::uint32_t> ids_;
};

// Signature ids and times of the calls in `calls` that form signatures (op != kOther), in order.
struct SignatureSequence {
  std::vector<std::uint32_t> symbols;
  std::vector<std::int64_t> t_ns;
};
[[nodiscard]] SignatureSequence MakeSignatureSequence(std::span<const CallRecord> calls,
                                                      SignatureTable& table);

}  // namespace falcon::analyzer
