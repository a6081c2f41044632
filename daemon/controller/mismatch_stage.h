// MismatchStage: the controller's mismatch detection while the job runs (docs/hangs.md,
// "Mismatches"). Its own unit with its own state and log prefix (event=mismatch_*); Controller
// feeds it the agents' call_signatures messages and writes the entries it asks for.
//  - Every rank's agent sends the collectives the rank issued, a few times a second (agent
//    signature_ms). The stage holds each (communicator, seq) in an analyzer::CallLedger until
//    every member reported it; a difference in op, datatype, count, reduction or root is decided
//    when all members reported, or grace_s after it was first seen.
//  - Each mismatch becomes one incident entry, stage `mismatch`, id mismatch-<comm>-<seq>,
//    naming the ranks that differ from the most common signature and their hosts, with every
//    rank's signature as evidence (the same entry layout as HangStage's findings).
//  - Past the agents' signature_full_seqs, calls come as one digest per block of
//    protocol::kSignatureBlockCalls seqs. Blocks are compared like calls, in a ledger of their
//    own; a difference becomes an entry with id mismatch-<comm>-<seq>-block, naming the ranks
//    whose digest differs from the most common one, with each rank's calls and digest as
//    evidence (which call differs is not known: the calls were not sent).
//  - HangStage finds the same mismatches in a stalled job's progress: Recorded() tells the
//    controller which ones this stage wrote already, so each is written once.
// Thread-safety: a value type for one thread (the controller loop). Must never: do I/O, read a
// clock (times are the caller's), or trust a message it was not given validated.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <set>
#include <utility>
#include <vector>

#include "analyzer/call_ledger.h"
#include "daemon/controller/hang_stage.h"
#include "daemon/controller/job_view.h"

namespace falcon::controller {

struct MismatchStageOptions {
  double grace_s = 0.3;           // decide a difference without the members not heard from yet
  std::size_t max_per_comm = 8;   // mismatch entries per communicator at most
};

class MismatchStage {
 public:
  explicit MismatchStage(MismatchStageOptions options = {});

  // A validated call_signatures message, read at now_ns.
  void OnSignatures(const nlohmann::json& m, std::int64_t now_ns);
  // The entries to write now (oldest first, drained): one per mismatch decided by now_ns. If
  // writing one fails, hand it back with Unwritten so it is written next turn.
  std::vector<HangRecord> Next(const JobView& view, std::int64_t now_ns);
  void Unwritten(std::vector<HangRecord> records);
  // Whether this stage raised the mismatch of (comm, seq) already.
  bool Recorded(std::uint64_t comm, std::uint64_t seq) const { return recorded_.count({comm, seq}) > 0; }

  const analyzer::CallLedger& ledger() const { return ledger_; }
  const analyzer::CallLedger& blocks() const { return blocks_; }
  std::uint64_t messages() const { return messages_; }
  std::uint64_t calls() const { return calls_; }  // calls reported, one by one or in blocks

 private:
  analyzer::CallLedger ledger_;
  analyzer::CallLedger blocks_;  // digests: a block's first seq, its calls as `peer`, digest as `count`
  std::vector<HangRecord> records_;
  std::set<std::pair<std::uint64_t, std::uint64_t>> recorded_;
  std::deque<std::pair<std::uint64_t, std::uint64_t>> recorded_order_;  // to bound recorded_
  std::uint64_t messages_ = 0;
  std::uint64_t calls_ = 0;
};

}  // namespace falcon::controller
