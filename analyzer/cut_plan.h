// Consistent cuts without a world collective: where each rank must stop so that, on every
// communicator, every member has issued exactly the same number of ordered calls.
//
// A real job (Megatron-LM, plain DDP) issues no collective that spans every rank per iteration:
// its traffic is on TP, DP, PP, model-parallel and embedding groups. A pause that stops every
// rank before "call N of one communicator" is then impossible; instead each rank r gets a stop
// position x_r in its own stream of ordered calls, and the cut is consistent when for every
// communicator c and members r, s: E_{r,c}(x_r) = E_{s,c}(x_s), where E_{r,c}(x) is the number
// of calls rank r has issued on c before its position x. A consistent cut leaves no issued call
// unmatched, so once the ranks stop no device work waits on a stopped peer.
//
// Input per rank: one period of its ordered calls (RankCallPattern), cut into units: a unit is
// one call outside any group, or one whole ncclGroupStart/End group (a rank never stops inside a
// group). Positions count units from the pattern's start and extrapolate the period into the
// future. Output per rank: the stop position, and per communicator the trigger (the shim stops
// before the first call whose sequence number reaches it; inside a group, right after the group)
// and the count every member must have issued once stopped (the agent checks it).
//
// Point-to-point traffic: a communicator whose members issue sends and receives (a pipeline
// group whose stages exchange activations on it, as PyTorch's batched isend/irecv do) has no
// common call count: a middle stage calls it twice as often as an end stage. There the counts
// are kept per channel instead: the collectives on c (every member alike), and for each ordered
// pair of members (i, j) the sends from i to j, which must equal j's receives from i. A prefix of
// a run that completes, whose every channel's counts agree, leaves no issued call unmatched: each
// call in it waits only on earlier calls of its own rank and on its partners, which are in it.
// A communicator is counted per channel when every member's pattern carries channels and its
// own comm rank; otherwise by its total (the older agents' report).
//
// Solving: each E_{r,c} is non-decreasing in x, so the solutions are closed under pointwise min;
// bounds propagation over [min_position, min_position + horizon] (lower bounds raised until
// every communicator's members agree) reaches the earliest consistent cut, or proves that
// there is none in the horizon. Cost: O(rounds x sum over ranks of comms x log(horizon)).
// PlanCut indexes the patterns and builds the constraints once, then solves once per iteration
// it tries (iteration_start_tries, the search for a later iteration): a solve costs only the
// propagation.
// Thread-safety: stateless functions. Must never: do I/O, read clocks or globals.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace falcon::analyzer {

// Calls of one unit on one communicator (index into RankCallPattern::comms) and, where that
// communicator carries channels, on one of them (index into PatternComm::channels).
struct UnitCalls {
  std::uint32_t comm = 0;
  std::uint32_t count = 0;
  std::uint32_t channel = 0;
};

// One call outside a group (one entry, count 1), or one group (its calls per communicator).
struct CallUnit {
  bool group = false;
  std::vector<UnitCalls> calls;
};

enum class ChannelKind : std::uint8_t { kCollective = 0, kSend = 1, kRecv = 2 };

// One channel of a rank on a communicator: its collectives (and every other ordered call all
// members make: init, split, finalize), or its sends to / receives from one peer.
struct PatternChannel {
  ChannelKind kind = ChannelKind::kCollective;
  std::int32_t peer = -1;  // the peer's comm rank (kSend, kRecv); -1 for kCollective
  std::uint64_t base = 0;  // calls on the channel before position 0
};

struct PatternComm {
  std::uint64_t id = 0;         // the communicator id every member computes alike
  std::int64_t nranks = 0;      // members; a cut needs the pattern of every one of them
  std::uint64_t base_seq = 0;   // calls issued on it before position 0 (the next call's comm_seq)
  std::int32_t rank = -1;       // the rank's own comm rank; -1: unknown
  // Every channel with a call since the communicator was created; empty: not counted per
  // channel (unknown), and the units' `channel` means nothing.
  std::vector<PatternChannel> channels;
};

struct RankCallPattern {
  std::int64_t rank = -1;
  std::vector<PatternComm> comms;  // every live communicator of the rank, patterned or not
  std::vector<CallUnit> units;     // one period, starting at position 0; may be empty (no traffic)
  std::uint64_t min_position = 0;  // earliest allowed stop (the caller adds its lead)
  // The iteration that starts at position 0 (and every units.size() positions after it), when
  // position 0 is an iteration boundary of the rank's series.
  std::optional<std::uint64_t> iteration_at_start;
};

struct CutTarget {
  std::uint64_t comm = 0;
  std::uint64_t trigger_seq = 0;  // stop before the call with this comm_seq (after its group)
  std::uint64_t expect_seq = 0;   // calls issued on comm once stopped
};

struct RankCut {
  std::int64_t rank = -1;
  std::uint64_t position = 0;  // units after the pattern's start
  std::vector<CutTarget> targets;
};

struct CutOptions {
  // Search [min_position, min_position + horizon x period] per rank: wide enough for ranks
  // whose reports were taken far apart (each rank's minimum is where it will be, not a common
  // point; the cut lands near the furthest of them). Cost grows with log(horizon) only.
  std::uint64_t horizon_periods = 4096;
  // Propagation rounds before giving up: at least this many, and at least 64 per constraint (a
  // job of 16,384 ranks whose pipelines are counted per channel has 33,000 of them, each visited
  // once before any is visited again).
  std::uint64_t max_rounds = 100000;
  // Stop the lowest rank exactly at the start of this iteration (falcon-ctl pause --iteration);
  // needs that rank's iteration_at_start.
  std::optional<std::uint64_t> iteration;
  // Without `iteration`: > 0 stops the lowest rank at the first iteration start it can still
  // reach (trying this many iterations), where the cut costs the least: frameworks synchronise
  // the host with the device at the end of an iteration, so little device work is queued behind
  // the stop and a validation's GEMM need not wait for it. Falls back to the earliest cut when
  // that rank has no iteration boundary, or none of those iterations has a consistent cut.
  std::uint64_t iteration_start_tries = 0;
};

struct CutPlan {
  std::vector<RankCut> ranks;  // same order as the input; empty on failure
  std::string failure;         // why there is no cut; empty on success
  // With `iteration` given and failing only because it has passed or some rank will be past it
  // before a pause reaches it ("too soon"): a later iteration that has a consistent cut as
  // these reports stand, the first where later ones keep working, found in O(log) plans; unset
  // when none is within the horizon. The job runs on while a caller acts on it: aim past it.
  std::optional<std::uint64_t> later_iteration;
  bool ok() const { return failure.empty(); }
};

// E_{r,c}(position): calls issued on comm index c of `p` before `position`.
std::uint64_t IssuedBefore(const RankCallPattern& p, std::uint32_t comm, std::uint64_t position);
// The same for one channel of that communicator (index into its channels).
std::uint64_t IssuedOnChannelBefore(const RankCallPattern& p, std::uint32_t comm, std::uint32_t channel,
                                    std::uint64_t position);

// The lowest rank's first iteration whose start is at or after its min_position: what it can
// still be stopped at. nullopt when there is no rank, or the lowest has no iteration boundary
// or no calls.
std::optional<std::uint64_t> FirstReachableIteration(std::span<const RankCallPattern> ranks);

// REQUIRES: each pattern's unit calls name comm indices < comms.size() and, where that comm has
// channels, channel indices < its channels.size() (ParseCutPattern checks both).
CutPlan PlanCut(std::span<const RankCallPattern> ranks, const CutOptions& options = {});

}  // namespace falcon::analyzer
