// Profiling-phase analysis for the controller (FALCON §4.3): which communicators do the same work
// per iteration, which of them are slower than their peers, and which rank of a communicator is
// a compute suspect.
//  - Classes: communicators with the same size and the same per-iteration call signature (the
//    multiset of (op, bytes) they carry per iteration) form a class. In a TP x DP x PP job with
//    balanced stages these are the TP groups, the DP groups and the PP pairs, found from the
//    signatures alone (no framework hints). Send and Recv count as one "P2P" op by default: a PP
//    pair's first rank sends what its second receives.
//  - Suspicion: a communicator whose transfer-time metric exceeds `suspicious_ratio` x its class
//    median is suspicious. A class with one member (or one member with data) has no peers: said
//    so, never flagged.
//  - Compute suspect: in a collective, all ranks finish together, so a rank that enters late
//    (slow compute before the call) waits least and makes the others wait. The wait signal
//    (local durations) is immune to clock skew between nodes; arrival times (wall clock) confirm
//    it. The suspect must stand out by a margin, consistently over the calls.
// Thread-safety: stateless functions; safe from any thread.
// Must never: do I/O, read clocks or globals, guess a class from communicator names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "analyzer/signature.h"
#include "falcon/status.h"

namespace falcon::analyzer {

// `count` calls of `op` moving `bytes` each (count x element size), per iteration.
struct SignatureTerm {
  OpKind op = OpKind::kOther;
  std::uint64_t bytes = 0;
  std::uint32_t count = 0;
  friend bool operator==(const SignatureTerm&, const SignatureTerm&) = default;
};

// One communicator as the profiler sees it, e.g. from one member rank's period.
struct CommProfile {
  std::uint64_t id = 0;                   // 64-bit communicator id (shm comm table)
  std::uint32_t nranks = 0;               // >= 1
  std::vector<std::int32_t> members;      // global ranks in comm-rank order; empty = unknown
  std::vector<SignatureTerm> signature;   // per-iteration calls; terms may repeat (summed)
};

enum class SizeMatch : std::uint8_t {
  kExact,      // bytes must be equal
  kSizeClass,  // bytes within a power of two (SizeClass in signature.h) match
};

enum class P2pMatch : std::uint8_t {
  kMergeSendRecv,  // Send and Recv are one op (the two ends of a pair see mirror images)
  kDistinguish,
};

struct ClassOptions {
  SizeMatch size_match = SizeMatch::kExact;
  P2pMatch p2p_match = P2pMatch::kMergeSendRecv;
};

inline constexpr std::size_t kNoClass = std::numeric_limits<std::size_t>::max();

struct CommClass {
  std::uint32_t nranks = 0;
  std::vector<SignatureTerm> signature;  // canonical (see CanonicalSignature)
  std::vector<std::size_t> comms;        // indices into the input, ascending
};

struct CommClassification {
  std::vector<CommClass> classes;    // ordered by their first member's index
  std::vector<std::size_t> class_of;  // per input communicator; kNoClass when idle
  std::vector<std::size_t> idle;     // communicators with an empty signature (no class)
};

// The signature as classes compare it: kOther terms and zero counts dropped, Send/Recv merged
// (per options), bytes replaced by their size class (per options), equal terms summed, sorted
// by (op, bytes).
[[nodiscard]] std::vector<SignatureTerm> CanonicalSignature(std::span<const SignatureTerm> terms,
                                                            const ClassOptions& options = {});

// Groups communicators into classes. InvalidArgument when a communicator has nranks == 0, a
// member list whose size is not nranks, or an id used twice.
[[nodiscard]] Result<CommClassification> ClassifyCommunicators(
    std::span<const CommProfile> comms, const ClassOptions& options = {});

enum class SuspicionBaseline : std::uint8_t {
  kClassMedian,  // median over the whole class, the communicator included (FALCON)
  kPeerMedian,   // median over the others: more sensitive in classes of 2 to 4
};

struct SuspicionOptions {
  double suspicious_ratio = 1.1;
  SuspicionBaseline baseline = SuspicionBaseline::kClassMedian;
};

enum class CommVerdict : std::uint8_t {
  kHealthy,
  kSuspicious,
  kNoPeers,  // its class has no other member with data: nothing to compare against
  kNoData,   // idle communicator, or its metric is missing (not finite or <= 0)
};

struct CommAssessment {
  std::size_t comm = 0;                // index into the input
  std::size_t class_index = kNoClass;  // kNoClass when idle
  CommVerdict verdict = CommVerdict::kNoData;
  double metric = 0.0;    // as given (e.g. median seconds per iteration)
  double baseline = 0.0;  // class (or peer) median; 0 when there is none
  double ratio = 0.0;     // metric / baseline; 0 when there is no baseline
  std::size_t peers = 0;  // other class members with data
};

// One assessment per communicator, in input order. `metric[i]` belongs to communicator i; a
// missing value is NaN (or <= 0). InvalidArgument when metric.size() differs from the number of
// classified communicators or suspicious_ratio < 1.
[[nodiscard]] Result<std::vector<CommAssessment>> FlagSuspicious(
    const CommClassification& classes, std::span<const double> metric,
    const SuspicionOptions& options = {});

// Per-call timings of one communicator's ranks for the same collectives (calls matched by the
// per-communicator sequence number). Row-major, calls x nranks.
struct CollectiveTimings {
  std::size_t nranks = 0;
  // arrival_ns[k * nranks + r]: when rank r entered call k (CLOCK_REALTIME ns). May be empty:
  // then only the wait signal is used (e.g. clocks known to be skewed).
  std::span<const std::int64_t> arrival_ns;
  // wait_s[k * nranks + r]: how long rank r's call k took, seconds (finite, >= 0).
  std::span<const double> wait_s;
};

struct ComputeSuspectOptions {
  std::size_t min_calls = 8;       // fewer calls: kTooFewCalls
  // The suspect's wait advantage over the next-least waiter: median over calls divided by its
  // robust spread (1.4826 MAD) must reach this. Scale-free.
  double min_snr = 3.0;
  // ... and the others must wait at least this fraction longer than the suspect (median over
  // calls): a lead far below the call's own duration is not worth a validation.
  double min_wait_gap = 0.05;
  // Fraction of calls in which the suspect waits least (and, with arrivals, enters last).
  double min_consistency = 0.75;
};

enum class SuspectVerdict : std::uint8_t {
  kFound,
  kNoSuspect,       // nobody waits clearly less than the others (healthy, or a tie)
  kInconsistent,    // someone stands out in the medians, but not in enough calls
  kClockDisagrees,  // least waiter does not enter last often enough (clock skew, or no compute
                    // straggler); not acted on
  kTooFewCalls,
};

struct ComputeSuspect {
  SuspectVerdict verdict = SuspectVerdict::kNoSuspect;
  std::int32_t rank = -1;         // communicator rank; the candidate even when not kFound (-1
                                  // for kTooFewCalls)
  double wait_advantage_s = 0.0;  // median over calls of (next-least wait - its wait)
  double wait_gap = 0.0;          // wait_advantage_s / median wait of the other ranks
  double lateness_s = 0.0;        // median over calls of (its arrival - next-latest arrival); 0
                                  // without arrivals
  double snr = 0.0;               // wait advantage median / robust spread (capped at 1e6)
  double wait_consistency = 0.0;     // fraction of calls in which it waits least
  double arrival_consistency = 0.0;  // fraction in which it enters last (1 without arrivals)
  double confidence = 0.0;  // fraction of calls in which it both waits least and enters last
};

// InvalidArgument when nranks < 2, wait_s is not a whole number of rows, arrival_ns (when given)
// differs in size from wait_s, or a wait is negative or not finite.
[[nodiscard]] Result<ComputeSuspect> FindComputeSuspect(
    const CollectiveTimings& timings, const ComputeSuspectOptions& options = {});

}  // namespace falcon::analyzer
