// SignatureLog: the collectives one rank issued since they were last taken, as runs of alike
// consecutive calls per communicator: the body of a call_signatures message (protocol.h), which
// the controller compares across members to raise mismatches (analyzer/call_ledger.h).
//  - Collectives only (AllReduce .. Scatter, FalconOpIsOrdered): sends and receives pair with
//    their peer's, and a communicator's init, split or finalize legitimately differ by member.
//  - A communicator of more than two ranks on which this rank issued a send or a receive is
//    left out from then on: its comm_seq no longer lines up with the other members'.
//  - Reductions created by the user (ncclRedOpCreatePreMulSum: handles may differ between
//    members) are reported as kCustomRedOp.
//  - Benchmark calls (kFalconFlagBenchmark) are not training and are skipped by the caller.
// At most max_runs runs are held; calls beyond are counted in the next Take's `dropped`.
// Thread-safety: one owner (the agent loop). Must never: block, throw on bad records.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "daemon/protocol/messages.h"
#include "falcon/shm_abi.h"

namespace falcon::agent {

inline constexpr std::int32_t kCustomRedOp = 5;  // ncclNumOps: any user-created reduction

class SignatureLog {
 public:
  explicit SignatureLog(std::size_t max_runs = 4096) : max_runs_(max_runs) {}

  // One ordered record on communicator `comm_id` of `nranks` members.
  void Push(const FalconRecord& r, std::uint64_t comm_id, std::int32_t nranks);
  // Records the reader lost: their calls cannot be sent.
  void Lost(std::uint64_t n) { dropped_ += n; }
  bool empty() const { return runs_ == 0 && dropped_ == 0; }
  // The runs held, per communicator in id order, and the calls dropped since the last Take.
  std::vector<protocol::CommSignatures> Take(std::uint64_t* dropped);

 private:
  struct CommLog {
    std::int32_t nranks = 0;
    bool unaligned = false;
    std::uint8_t last_op = 0;  // FalconOp of runs.back()
    std::vector<protocol::SignatureRun> runs;
  };
  std::size_t max_runs_;
  std::map<std::uint64_t, CommLog> comms_;
  std::size_t runs_ = 0;
  std::uint64_t dropped_ = 0;
};

}  // namespace falcon::agent
