// Hang diagnosis: from every rank's progress on its communicators, the wait-for picture of a job
// that stopped making progress, and who or what it waits for.
//
// Input, per rank (what the shim's progress table or a Flight Recorder dump tells):
//  - per communicator: how many ordered calls the rank issued (the next comm_seq) and how many of
//    those completed on the device (a prefix: a communicator's work completes in order);
//  - its latest calls in issue order, each with its communicator, comm_seq, signature (op,
//    datatype, count, reduction, root or peer), the device queue (stream) it went to, and
//    whether its device work completed;
//  - whether its host thread is inside an NCCL call that has not returned, and on which
//    communicator (a blocking ncclGroupEnd, an init or split waiting for its peers).
// Findings:
//  - kNotIssued: members of a communicator that never issued call n while others did and wait
//    for it. The chain is followed: a laggard that itself waits in another communicator is not
//    the culprit, the rank it waits for is; the root is a rank that waits for nobody (blocked
//    outside NCCL, e.g. in its data loader), one blocked inside an NCCL call, or one whose own
//    device work does not complete.
//  - kNotCompleting: every member issued call n and its device work does not finish: the
//    communicator, and the members whose work is still pending where only some are.
//  - kMismatch: the same (communicator, comm_seq) collective issued with a different op,
//    datatype, count, reduction or root on different ranks; the ranks that differ from the most common signature
//    are named. Raised whenever it is seen, hang or not.
//  - kDeadlock: a cycle of device work waiting on device work: two communicators that share ranks
//    with their calls queued in opposite orders on one stream each. The cycle's calls are named.
//  - kDisorder: the same inversion seen while it did not block (yet): two calls that two ranks
//    each queued on one stream, in opposite orders (the necessary condition for that deadlock).
// Point-to-point: a send or receive waits only for its peer's matching receive or send on the
// same communicator; comm_seq alignment across members is assumed for collectives only (and for
// communicators of two ranks, whose sends and receives pair up).
// The snapshot should be of a stalled job: on a running one, calls in flight look like
// kNotCompleting and fast ranks ahead look like laggards behind them. Pure functions, any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace falcon::analyzer {

// What a call was issued with; op is a FalconOp code (falcon/shm_abi.h).
struct CallSignature {
  std::uint8_t op = 0;
  std::uint8_t dtype = 0xFF;  // ncclDataType_t, 0xFF none
  std::int16_t redop = -1;    // ncclRedOp_t, -1 none
  std::int32_t peer = -1;     // root (rooted collectives) or peer (send / receive), -1 none
  std::uint64_t count = 0;
  bool operator==(const CallSignature&) const = default;
};

struct IssuedCall {
  std::uint64_t comm = 0;  // communicator id (alike on every member)
  std::uint64_t seq = 0;   // comm_seq
  CallSignature sig;
  std::uint64_t stream = 0;  // the device queue, process-local; 0 where unknown
  std::uint64_t group = 0;   // calls of this rank with the same non-zero group were launched
                             // together (one ncclGroupStart/End): not ordered among themselves
  bool completed = false;    // its device work finished
  std::int64_t issue_ns = 0;  // wall-clock time it was issued (ns since the epoch), 0 unknown;
                              // for people only, never used by the diagnosis
};

struct CommProgress {
  std::uint64_t comm = 0;
  std::int32_t nranks = 0;
  std::int32_t comm_rank = -1;  // this rank's rank in it (peers of sends and receives are these)
  std::uint64_t issued = 0;     // ordered calls issued: the next comm_seq
  std::uint64_t completed = 0;  // of those, how many completed on the device (a lower bound
                                // where completion_known is false)
  // False where device completion is not tracked (no CUDA driver, tracking off, calls that could
  // not be tracked): the member counts as waiting in its latest call, its calls are never
  // pending in a stream's queue, and the communicator is never judged not completing.
  bool completion_known = true;
  std::string name;             // for people only: commName, process-group name, ...
};

struct RankProgress {
  std::int64_t rank = -1;  // global rank
  std::string host;
  std::vector<CommProgress> comms;
  std::vector<IssuedCall> recent;         // latest calls, oldest first
  std::optional<std::uint64_t> in_call;   // the host thread is inside an NCCL call on this comm
                                          // (0: on none known, e.g. ncclGroupEnd or an init)
};

enum class FindingKind { kNotIssued, kNotCompleting, kMismatch, kDeadlock, kDisorder };
const char* FindingKindName(FindingKind k);  // "not_issued", ...

struct CallRef {
  std::int64_t rank = -1;
  std::uint64_t comm = 0;
  std::uint64_t seq = 0;
  bool operator==(const CallRef&) const = default;
};

struct Finding {
  FindingKind kind = FindingKind::kNotIssued;
  std::uint64_t comm = 0;  // the call in question (kDeadlock / kDisorder: the first of the cycle)
  std::uint64_t seq = 0;
  std::vector<std::int64_t> culprits;  // ranks named, ascending
  std::vector<std::int64_t> waiting;   // ranks held by it, ascending
  // kNotIssued: the wait chain from the call to the root, one entry per rank it passes (the
  // call that rank waits in; seq ~0 for the root, which waits in none); kDeadlock / kDisorder:
  // the calls involved.
  std::vector<CallRef> chain;
  std::vector<std::pair<std::int64_t, CallSignature>> signatures;  // kMismatch: each rank's
  std::string summary;  // one line for people
};

struct HangDiagnosisOptions {
  std::size_t max_findings = 64;  // of each kind
};

// Every finding in `ranks`, most severe kinds first (deadlock, not issued, not completing,
// mismatch, disorder), each kind ordered by communicator and seq. Ranks may be given in any
// order; a rank listed twice counts once (the first).
std::vector<Finding> DiagnoseHang(std::span<const RankProgress> ranks, const HangDiagnosisOptions& options = {});

// The mismatch among the signatures each rank issued one collective (comm, seq) with: nullopt
// when they all agree. Culprits: the ranks that differ from the most common signature; a tie goes
// to `prefer` where it is one of the most common (e.g. what like communicators issued at that
// seq), else to the lowest rank's. `signatures` ascending by rank. A rank given twice counts twice.
std::optional<Finding> MismatchOf(std::uint64_t comm, std::uint64_t seq,
                                  std::vector<std::pair<std::int64_t, CallSignature>> sigs,
                                  const CallSignature* prefer = nullptr);

// Whether FalconOp `op` is a collective (AllReduce .. Scatter): alike on every member, compared.
bool IsCollectiveOp(std::uint8_t op);

// "AllReduce", "Send", ... for a FalconOp code; "op N" for others.
std::string CallOpName(std::uint8_t op);

}  // namespace falcon::analyzer
