// Ring and tree validation passes, executor tasks. See validation_plan.h for the contract.
#include "analyzer/validation_plan.h"

#include <string>

namespace falcon::analyzer {
namespace {

std::int32_t Rank(std::size_t i) { return static_cast<std::int32_t>(i); }

Status CheckSize(std::size_t n) {
  if (n < 2 || n > kMaxPlanRanks) {
    return Status::InvalidArgument("a validation plan needs 2.." + std::to_string(kMaxPlanRanks) +
                                   " ranks, got " + std::to_string(n));
  }
  return Status::Ok();
}

// Pass of ring link i for odd n (>= 3): colours 0,1,2 repeated; the last 1 or 2 links get 1 or
// 0,1. Neighbouring links (which share a rank) never get the same colour, including the wrap
// from link n-1 to link 0, and the three passes differ in size by at most one.
std::size_t OddRingPass(std::size_t i, std::size_t n) {
  const std::size_t full = n / 3 * 3;
  if (i < full) return i % 3;
  return n - full == 1 ? 1 : i - full;
}

std::size_t Depth(std::size_t node) {
  std::size_t depth = 0;
  for (std::size_t v = node + 1; v > 1; v >>= 1) ++depth;
  return depth;
}

FalconTask BlankTask(std::uint32_t kind, std::uint32_t repeats) {
  FalconTask task{};
  task.kind = kind;
  task.repeats = repeats;
  task.comm_slot = 0;
  task.send_peer = -1;
  task.recv_peer = -1;
  return task;
}

ValidationPlan Assemble(PlanTopology topology, std::size_t n,
                        std::vector<ValidationPass> passes) {
  ValidationPlan plan;
  plan.topology = topology;
  plan.nranks = n;
  for (ValidationPass& pass : passes) {
    if (!pass.transfers.empty()) plan.passes.push_back(std::move(pass));
  }
  return plan;
}

}  // namespace

std::vector<PlannedTransfer> RingLinks(std::size_t n) {
  std::vector<PlannedTransfer> links;
  links.reserve(n);
  for (std::size_t i = 0; i < n; ++i) links.push_back({Rank(i), Rank((i + 1) % n)});
  return links;
}

std::vector<PlannedTransfer> TreeLinks(std::size_t n) {
  std::vector<PlannedTransfer> links;
  links.reserve(n == 0 ? 0 : n - 1);
  for (std::size_t i = 1; i < n; ++i) links.push_back({Rank((i - 1) / 2), Rank(i)});
  return links;
}

Result<ValidationPlan> PlanRing(std::size_t n) {
  if (Status s = CheckSize(n); !s.ok()) return s;
  const std::vector<PlannedTransfer> links = RingLinks(n);
  std::vector<ValidationPass> passes(n % 2 == 0 ? 2 : 3);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t pass = n % 2 == 0 ? i % 2 : OddRingPass(i, n);
    passes[pass].transfers.push_back(links[i]);
  }
  return Assemble(PlanTopology::kRing, n, std::move(passes));
}

Result<ValidationPlan> PlanTree(std::size_t n) {
  if (Status s = CheckSize(n); !s.ok()) return s;
  std::vector<ValidationPass> passes(4);
  for (std::size_t child = 1; child < n; ++child) {
    const std::size_t parent = (child - 1) / 2;
    const std::size_t side = (child - 1) % 2;  // 0: left child (odd index), 1: right
    passes[2 * (Depth(parent) % 2) + side].transfers.push_back({Rank(parent), Rank(child)});
  }
  return Assemble(PlanTopology::kTree, n, std::move(passes));
}

Result<ValidationPlan> MakePlan(PlanTopology topology, std::size_t n) {
  return topology == PlanTopology::kRing ? PlanRing(n) : PlanTree(n);
}

Status CheckPlan(const ValidationPlan& plan) {
  std::vector<std::size_t> seen_in(plan.nranks, 0);  // 1 + index of the last pass a rank was in
  for (std::size_t p = 0; p < plan.passes.size(); ++p) {
    const ValidationPass& pass = plan.passes[p];
    if (pass.transfers.empty()) {
      return Status::InvalidArgument("pass " + std::to_string(p) + " is empty");
    }
    for (const PlannedTransfer& t : pass.transfers) {
      if (t.sender == t.receiver) {
        return Status::InvalidArgument("pass " + std::to_string(p) + ": rank " +
                                       std::to_string(t.sender) + " sends to itself");
      }
      for (const std::int32_t r : {t.sender, t.receiver}) {
        if (r < 0 || static_cast<std::size_t>(r) >= plan.nranks) {
          return Status::InvalidArgument("pass " + std::to_string(p) + ": rank " +
                                         std::to_string(r) + " outside the group");
        }
        std::size_t& slot = seen_in[static_cast<std::size_t>(r)];
        if (slot == p + 1) {
          return Status::InvalidArgument("pass " + std::to_string(p) + ": rank " +
                                         std::to_string(r) + " takes part in two transfers");
        }
        slot = p + 1;
      }
    }
  }
  return Status::Ok();
}

Result<ValidationPlan> RemapPlan(const ValidationPlan& plan,
                                 std::span<const std::int32_t> labels) {
  if (labels.size() != plan.nranks) {
    return Status::InvalidArgument("RemapPlan: " + std::to_string(labels.size()) +
                                   " labels for " + std::to_string(plan.nranks) + " ranks");
  }
  ValidationPlan out = plan;
  for (ValidationPass& pass : out.passes) {
    for (PlannedTransfer& t : pass.transfers) {
      t.sender = labels[static_cast<std::size_t>(t.sender)];
      t.receiver = labels[static_cast<std::size_t>(t.receiver)];
    }
  }
  return out;
}

Result<std::vector<RankTask>> PassTasks(const ValidationPass& pass,
                                        const P2pTaskOptions& options) {
  if (options.bytes < 1 || options.bytes > kMaxP2pBytes) {
    return Status::InvalidArgument("P2P bytes must be 1 B..1 GiB, got " +
                                   std::to_string(options.bytes));
  }
  if (options.repeats < 1 || options.repeats > kMaxTaskRepeats) {
    return Status::InvalidArgument("repeats must be 1..1000, got " +
                                   std::to_string(options.repeats));
  }
  std::vector<RankTask> tasks;
  tasks.reserve(2 * pass.transfers.size());
  for (const PlannedTransfer& t : pass.transfers) {
    RankTask send{t.sender, BlankTask(kFalconTaskP2p, options.repeats)};
    send.task.send_peer = t.receiver;
    send.task.bytes = options.bytes;
    RankTask recv{t.receiver, BlankTask(kFalconTaskP2p, options.repeats)};
    recv.task.recv_peer = t.sender;
    recv.task.bytes = options.bytes;
    tasks.push_back(send);
    tasks.push_back(recv);
  }
  return tasks;
}

Result<FalconTask> GemmTask(const GemmTaskOptions& options) {
  for (const std::uint32_t dim : {options.m, options.n, options.k}) {
    if (dim < 1 || dim > kMaxGemmDim) {
      return Status::InvalidArgument("GEMM dimensions must be 1..8192, got " +
                                     std::to_string(dim));
    }
  }
  if (options.repeats < 1 || options.repeats > kMaxTaskRepeats) {
    return Status::InvalidArgument("repeats must be 1..1000, got " +
                                   std::to_string(options.repeats));
  }
  FalconTask task = BlankTask(kFalconTaskGemm, options.repeats);
  task.m = options.m;
  task.n = options.n;
  task.k = options.k;
  return task;
}

}  // namespace falcon::analyzer
