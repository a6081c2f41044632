// SignatureLog. See signature_log.h for the contract.
#include "daemon/agent/signature_log.h"

#include <algorithm>

#include "analyzer/hang_diagnosis.h"

namespace falcon::agent {
namespace {

bool Rooted(std::uint8_t op) {
  return op == kFalconOpBroadcast || op == kFalconOpBcast || op == kFalconOpReduce || op == kFalconOpGather ||
         op == kFalconOpScatter;
}

bool P2P(std::uint8_t op) { return op == kFalconOpSend || op == kFalconOpRecv; }

constexpr std::int32_t kMaxRoot = 1 << 20;                  // protocol::kMaxCommRanks
constexpr std::uint64_t kMaxCount = 9'200'000'000'000'000'000ULL;  // protocol::kMaxI64
constexpr std::uint64_t kBlock = protocol::kSignatureBlockCalls;

}  // namespace

SignatureLog::SignatureLog(SignatureLogOptions options)
    : options_(options),
      full_start_(options.full_seqs >= kMaxCount ? kMaxCount
                                                 : (options.full_seqs + kBlock - 1) / kBlock * kBlock) {}

void SignatureLog::Push(const FalconRecord& r, std::uint64_t comm_id, std::int32_t nranks) {
  if (P2P(r.op)) {
    if (nranks > 2) {
      CommLog& c = comms_[comm_id];
      if (!c.unaligned) {
        c.unaligned = true;
        held_ -= c.runs.size() + c.blocks.size();
        c = CommLog{};
        c.unaligned = true;
      }
    }
    return;
  }
  if (!analyzer::IsCollectiveOp(r.op) || r.comm_seq > kMaxCount) return;
  CommLog& c = comms_[comm_id];
  if (c.unaligned) return;
  c.nranks = nranks;
  c.pushed = true;
  const bool gap = !c.seen || c.losses_seen != losses_;
  c.seen = true;
  c.losses_seen = losses_;
  // Kept within the message's bounds whatever the record says (a torn or hostile segment).
  Run run;
  run.seq = r.comm_seq;
  run.op = r.op;
  run.dtype = r.dtype;
  run.count = std::min<std::uint64_t>(r.count, kMaxCount);
  run.redop = static_cast<std::int16_t>(r.redop >= kCustomRedOp ? kCustomRedOp : std::max<std::int32_t>(r.redop, -1));
  run.root = Rooted(r.op) ? std::clamp<std::int32_t>(r.peer, -1, kMaxRoot) : -1;
  if (run.seq >= full_start_) {
    PushDigested(c, run, gap);
    return;
  }
  if (!c.runs.empty() && c.runs.back().Extends(run)) {
    ++c.runs.back().n;
    return;
  }
  if (held_ >= options_.max_runs) {
    ++dropped_;
    return;
  }
  c.runs.push_back(run);
  ++held_;
}

void SignatureLog::PushDigested(CommLog& c, const Run& run, bool gap) {
  const std::uint64_t index = run.seq / kBlock;
  if (!c.digesting) {
    c.digesting = true;
    c.newest = index;
  }
  if (index > c.newest) {
    // Blocks two or more behind the new one are complete.
    for (Block& b : c.open) {
      if (b.index != ~std::uint64_t{0} && b.index + 1 < index) Close(c, b);
    }
    c.newest = index;
    const std::uint64_t keep_from = (index - 1) * kBlock;
    std::size_t k = 0;
    while (k < c.held.size() && c.held[k].seq < keep_from) ++k;
    c.held.erase(c.held.begin(), c.held.begin() + static_cast<std::ptrdiff_t>(k));
    c.held_sent = c.held_sent > k ? c.held_sent - k : 0;
  } else if (index + 1 < c.newest) {
    // More than a block late (another thread's records held back that long): its block's digest
    // went out without it and will differ from the other members'. Counted, not hidden.
    ++dropped_;
    return;
  }
  Block& b = c.open[index & 1];
  if (b.index != index) b = Block{index, 0, 0, false};
  // Calls missing before this one may belong to its block, unless it starts the block.
  if (gap && (b.n > 0 || run.seq % kBlock != 0)) b.tainted = true;
  ++b.n;
  b.digest += protocol::SignatureDigestTerm(run.seq, run.op, run.dtype, run.count, run.redop, run.root);
  // Held runs never span a block: the older block's are dropped whole.
  if (c.held.size() > c.held_sent && c.held.back().Extends(run) && c.held.back().seq / kBlock == index) {
    ++c.held.back().n;
  } else {
    c.held.push_back(run);
  }
}

void SignatureLog::Close(CommLog& c, Block& b) {
  if (!b.tainted && b.n > 0) {
    if (held_ >= options_.max_runs) {
      dropped_ += b.n;
    } else {
      c.blocks.push_back({b.index * kBlock, b.n, b.digest});
      ++held_;
    }
  }
  b = Block{};
}

void SignatureLog::Lost(std::uint64_t n) {
  if (n == 0) return;
  dropped_ += n;
  ++losses_;
  for (auto& [id, c] : comms_) {
    for (Block& b : c.open) b.tainted = b.index != ~std::uint64_t{0};
  }
}

bool SignatureLog::empty() const {
  if (held_ > 0 || dropped_ > 0) return false;
  for (const auto& [id, c] : comms_) {
    if (c.held.size() > c.held_sent) return false;
  }
  return true;
}

TakenSignatures SignatureLog::Take() {
  TakenSignatures out;
  const auto to_protocol = [](const Run& r) {
    return protocol::SignatureRun{r.seq, r.n, analyzer::CallOpName(r.op), r.dtype, r.count, r.redop, r.root};
  };
  for (auto& [id, c] : comms_) {
    std::vector<protocol::SignatureRun> runs;
    runs.reserve(c.runs.size());
    for (const Run& r : c.runs) runs.push_back(to_protocol(r));
    c.runs.clear();
    // Idle since the last Take: the calls it stopped at go out in full.
    if (!c.pushed && c.held.size() > c.held_sent) {
      for (std::size_t k = c.held_sent; k < c.held.size(); ++k) runs.push_back(to_protocol(c.held[k]));
      c.held_sent = c.held.size();
    }
    c.pushed = false;
    if (!runs.empty()) out.comms.push_back({id, c.nranks, std::move(runs)});
    if (!c.blocks.empty()) {
      out.digests.push_back({id, c.nranks, std::move(c.blocks)});
      c.blocks.clear();
    }
  }
  held_ = 0;
  out.dropped = dropped_;
  dropped_ = 0;
  return out;
}

}  // namespace falcon::agent
