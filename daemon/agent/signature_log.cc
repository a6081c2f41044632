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

}  // namespace

void SignatureLog::Push(const FalconRecord& r, std::uint64_t comm_id, std::int32_t nranks) {
  if (P2P(r.op)) {
    if (nranks > 2) {
      CommLog& c = comms_[comm_id];
      if (!c.unaligned) {
        c.unaligned = true;
        runs_ -= c.runs.size();
        c.runs.clear();
      }
    }
    return;
  }
  if (!analyzer::IsCollectiveOp(r.op) || r.comm_seq == ~std::uint64_t{0}) return;
  CommLog& c = comms_[comm_id];
  if (c.unaligned) return;
  c.nranks = nranks;
  // Kept within the message's bounds whatever the record says (a torn or hostile segment).
  const std::int32_t redop = r.redop >= kCustomRedOp ? kCustomRedOp : std::max<std::int32_t>(r.redop, -1);
  const std::int32_t root = Rooted(r.op) ? std::clamp<std::int32_t>(r.peer, -1, kMaxRoot) : -1;
  const std::uint64_t count = std::min<std::uint64_t>(r.count, kMaxCount);
  if (!c.runs.empty() && c.last_op == r.op) {
    protocol::SignatureRun& last = c.runs.back();
    if (last.seq + last.n == r.comm_seq && last.dtype == r.dtype && last.count == count && last.redop == redop &&
        last.root == root) {
      ++last.n;
      return;
    }
  }
  if (runs_ >= max_runs_) {
    ++dropped_;
    return;
  }
  if (r.comm_seq > kMaxCount) return;
  c.runs.push_back({r.comm_seq, 1, analyzer::CallOpName(r.op), r.dtype, count, redop, root});
  c.last_op = r.op;
  ++runs_;
}

std::vector<protocol::CommSignatures> SignatureLog::Take(std::uint64_t* dropped) {
  std::vector<protocol::CommSignatures> out;
  for (auto& [id, c] : comms_) {
    if (c.runs.empty()) continue;
    out.push_back({id, c.nranks, std::move(c.runs)});
    c.runs.clear();
  }
  runs_ = 0;
  *dropped = dropped_;
  dropped_ = 0;
  return out;
}

}  // namespace falcon::agent
