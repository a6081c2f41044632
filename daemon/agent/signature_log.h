// SignatureLog: the collectives one rank issued since they were last taken: the body of a
// call_signatures message (protocol.h), which the controller compares across members to raise
// mismatches (analyzer/call_ledger.h).
//  - Collectives only (AllReduce .. Scatter, FalconOpIsOrdered): sends and receives pair with
//    their peer's, and a communicator's init, split or finalize legitimately differ by member.
//  - A communicator of more than two ranks on which this rank issued a send or a receive is
//    left out from then on: its comm_seq no longer lines up with the other members'.
//  - Reductions created by the user (ncclRedOpCreatePreMulSum: handles may differ between
//    members) are reported as kCustomRedOp.
//  - Benchmark calls (kFalconFlagBenchmark) are not training and are skipped by the caller.
// Calls below `full_seqs` (rounded up to a block) go out as runs of alike consecutive calls, so
// a job that starts out mismatched is shown call by call. Past it, each block of
// protocol::kSignatureBlockCalls comm_seqs goes out as one digest once the block is complete (a
// call two blocks on arrived, so records read a poll late still count); a block during which
// records were lost is not sent (its digest would differ from the other members'), nor is the
// first block of a communicator first seen past `full_seqs` unless its first call was seen (the
// agent started, or restarted, while the job ran); a call that arrives after its block was sent
// (more than a block late) is counted in `dropped`. The calls of
// the last two blocks are also held as runs: when a communicator issued nothing since the
// previous Take (a hang, or a call per iteration), the held runs not sent yet go out in full, so
// the call a job stops in is compared call by call.
// At most max_runs runs and blocks are held; calls beyond are counted in the next Take's
// `dropped`.
// Thread-safety: one owner (the agent loop). Must never: block, throw on bad records.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "daemon/protocol/messages.h"
#include "falcon/shm_abi.h"

namespace falcon::agent {

inline constexpr std::int32_t kCustomRedOp = 5;  // ncclNumOps: any user-created reduction

struct SignatureLogOptions {
  std::size_t max_runs = 4096;      // runs and blocks held between Takes
  std::uint64_t full_seqs = 4096;   // comm_seqs below this go out as runs (agent signature_full_seqs)
};

struct TakenSignatures {
  std::vector<protocol::CommSignatures> comms;  // runs, per communicator in id order
  std::vector<protocol::CommDigests> digests;   // completed blocks, per communicator in id order
  std::uint64_t dropped = 0;                    // calls left out since the last Take
  bool empty() const { return comms.empty() && digests.empty() && dropped == 0; }
};

class SignatureLog {
 public:
  explicit SignatureLog(SignatureLogOptions options = {});

  // One ordered record on communicator `comm_id` of `nranks` members.
  void Push(const FalconRecord& r, std::uint64_t comm_id, std::int32_t nranks);
  // Records the reader lost: their calls cannot be sent, and the open blocks cannot be digested.
  void Lost(std::uint64_t n);
  // Whether a Take now could return anything.
  bool empty() const;
  TakenSignatures Take();

 private:
  struct Run {
    std::uint64_t seq = 0;
    std::uint64_t n = 1;
    std::uint64_t count = 0;
    std::int32_t root = -1;
    std::int16_t redop = -1;
    std::uint8_t op = 0;
    std::uint8_t dtype = 255;
    bool Extends(const Run& next) const {
      return seq + n == next.seq && op == next.op && dtype == next.dtype && count == next.count &&
             redop == next.redop && root == next.root;
    }
  };
  struct Block {
    std::uint64_t index = ~std::uint64_t{0};  // none
    std::uint64_t n = 0;
    std::uint64_t digest = 0;
    bool tainted = false;
  };
  struct CommLog {
    std::int32_t nranks = 0;
    bool unaligned = false;
    bool pushed = false;                 // a call since the last Take
    bool seen = false;                   // a call of it was pushed (its blocks are seen whole)
    std::uint64_t losses_seen = 0;       // losses_ as of its last call
    std::vector<Run> runs;               // calls below full_start_, not sent yet
    std::vector<protocol::SignatureBlock> blocks;  // complete blocks, not sent yet
    bool digesting = false;
    std::uint64_t newest = 0;            // newest block index seen
    Block open[2];                       // blocks newest and newest - 1, at [index & 1]
    std::vector<Run> held;               // their calls, for an idle communicator
    std::size_t held_sent = 0;           // held[0, held_sent) went out already
  };
  // `gap`: calls of the communicator may be missing just before this one (records lost since
  // its previous call, or none seen before it).
  void PushDigested(CommLog& c, const Run& run, bool gap);
  void Close(CommLog& c, Block& b);

  SignatureLogOptions options_;
  std::uint64_t full_start_;
  std::map<std::uint64_t, CommLog> comms_;
  std::size_t held_ = 0;  // runs + blocks held
  std::uint64_t dropped_ = 0;
  std::uint64_t losses_ = 0;  // Lost() calls with n > 0
};

}  // namespace falcon::agent
