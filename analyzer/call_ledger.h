// CallLedger: mismatches raised while the job runs, from the collectives each rank reports as it
// issues them (docs/hangs.md, "Mismatches"). The n-th collective of a communicator (its comm_seq)
// must be issued with the same op, datatype, count, reduction and root by every member; NCCL
// does not check, and a difference hangs the job or silently corrupts data.
//
// Reports come in as runs: seq .. seq + n - 1 on one communicator, all with one signature. Each
// (communicator, seq) is held until every member reported it:
//  - all alike: forgotten;
//  - some differ: decided by analyzer::MismatchOf once every member reported, or `grace_ns`
//    after the first difference was seen (a member that never issues it, or whose reports are
//    late, cannot hold a mismatch back for long). Where the members split evenly (a pair: which
//    one is wrong?) the decision waits for the grace, and the signature that like communicators
//    (as many members) agreed on at the same seq is taken as intended: the n-th call of every
//    tensor-parallel group of a job is alike;
//  - incomplete: forgotten once `window` newer seqs of the communicator were reported, or its
//    first report is older than `max_age_ns` (a member not followed, records lost).
// At most `max_per_comm` mismatches are raised per communicator (a rank that issues every call
// wrongly would raise one per call); the rest are counted in suppressed().
// Thread-safety: a value type for one thread. Pure: times are the caller's.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "analyzer/hang_diagnosis.h"

namespace falcon::analyzer {

struct CallLedgerOptions {
  std::int64_t grace_ns = 300'000'000;
  std::uint64_t window = 16384;          // seqs kept per communicator behind its newest
  std::int64_t max_age_ns = 60'000'000'000;
  std::size_t max_per_comm = 8;
};

class CallLedger {
 public:
  explicit CallLedger(CallLedgerOptions options = {}) : options_(options) {}

  // Global rank `rank` issued calls seq .. seq + n - 1 on `comm` (of `nranks` members), each
  // with `sig`, reported at now_ns. A (rank, comm, seq) reported again is ignored; n == 0 is a
  // no-op; nranks < 2 is never compared.
  void Add(std::int64_t rank, std::uint64_t comm, std::int32_t nranks, std::uint64_t seq, std::uint64_t n,
           const CallSignature& sig, std::int64_t now_ns);
  // Mismatches decided by now_ns (oldest first), each once; forgets what is out of the window.
  std::vector<Finding> Take(std::int64_t now_ns);
  // Forgets every comparison that rank takes part in (its process restarted: new communicators).
  void ForgetRank(std::int64_t rank);

  std::uint64_t compared() const { return compared_; }      // (comm, seq) every member agreed on
  std::uint64_t raised() const { return raised_; }
  std::uint64_t suppressed() const { return suppressed_; }
  std::uint64_t expired() const { return expired_; }        // forgotten incomplete
  std::size_t pending() const;                               // (comm, seq) held now

 private:
  struct Entry {
    std::vector<std::pair<std::int64_t, CallSignature>> reports;
    std::int64_t first_ns = 0;
    std::int64_t differ_ns = -1;  // when a report first differed, -1 none
  };
  struct Comm {
    std::int32_t nranks = 0;
    std::uint64_t newest = 0;
    std::size_t raised = 0;
    std::int64_t last_ns = 0;  // latest report
    std::map<std::uint64_t, Entry> seqs;
  };
  // Settles one entry: a mismatch is raised (or suppressed), an agreement counted; erases it.
  void Decide(std::uint64_t comm_id, Comm& c, std::map<std::uint64_t, Entry>::iterator it);
  // Whether the entry's most common signature is shared by as many members as another.
  static bool Tied(const Entry& e);
  // Settles the entries of `c` more than `window` behind `newest`.
  void Evict(std::uint64_t comm_id, Comm& c, std::uint64_t newest);

  CallLedgerOptions options_;
  std::map<std::uint64_t, Comm> comms_;
  std::set<std::pair<std::uint64_t, std::uint64_t>> differing_;  // (comm, seq) with a difference
  // What complete, agreeing entries held, by (nranks, seq): the tie-breaker. Bounded (FIFO).
  std::map<std::pair<std::int32_t, std::uint64_t>, CallSignature> agreed_;
  std::deque<std::pair<std::int32_t, std::uint64_t>> agreed_order_;
  std::vector<Finding> decided_;
  std::uint64_t compared_ = 0;
  std::uint64_t raised_ = 0;
  std::uint64_t suppressed_ = 0;
  std::uint64_t expired_ = 0;
};

}  // namespace falcon::analyzer
