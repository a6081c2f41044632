// MismatchStage. See mismatch_stage.h for the contract.
#include "daemon/controller/mismatch_stage.h"

#include <algorithm>
#include <array>
#include <string>

#include "daemon/protocol/messages.h"

namespace falcon::controller {
namespace {

using json = nlohmann::json;

constexpr std::size_t kRecordedMax = 4096;

// FalconOp code of an operation name the agent sent (analyzer::CallOpName), 0 if unknown: a
// name both members sent alike still compares alike.
std::uint8_t OpCode(const std::string& name) {
  static const std::array<std::string, 256> kNames = [] {
    std::array<std::string, 256> n;
    for (std::size_t op = 1; op < n.size(); ++op) n[op] = analyzer::CallOpName(static_cast<std::uint8_t>(op));
    return n;
  }();
  for (std::size_t op = 1; op < kNames.size(); ++op) {
    if (kNames[op] == name) return static_cast<std::uint8_t>(op);
  }
  return 0;
}

// The CallSignature a block's digest is compared as: only block entries share its op.
constexpr std::uint8_t kBlockOp = 0xFE;

analyzer::CallSignature BlockSignature(std::uint64_t n, std::uint64_t digest) {
  analyzer::CallSignature s;
  s.op = kBlockOp;
  s.peer = static_cast<std::int32_t>(n);  // <= kSignatureBlockCalls (validated)
  s.count = digest;
  return s;
}

std::string DescribeBlock(const analyzer::CallSignature& s) {
  return std::to_string(s.peer) + " calls with digest " + protocol::CommIdHex(s.count);
}

}  // namespace

MismatchStage::MismatchStage(MismatchStageOptions options)
    : ledger_(analyzer::CallLedgerOptions{static_cast<std::int64_t>(options.grace_s * 1e9), 16384,
                                          60'000'000'000, options.max_per_comm}),
      blocks_(analyzer::CallLedgerOptions{static_cast<std::int64_t>(options.grace_s * 1e9),
                                          64 * protocol::kSignatureBlockCalls, 60'000'000'000,
                                          options.max_per_comm}) {}

void MismatchStage::OnSignatures(const json& m, std::int64_t now_ns) {
  ++messages_;
  const std::int64_t rank = m["rank"].get<std::int64_t>();
  if (rank < 0) return;  // a rank not known yet cannot be named
  for (const json& c : m["comms"]) {
    const std::optional<std::uint64_t> comm = protocol::ParseCommIdHex(c["id"].get<std::string>());
    if (!comm) continue;
    const auto nranks = c["nranks"].get<std::int32_t>();
    for (const json& r : c["runs"]) {
      analyzer::CallSignature sig;
      sig.op = OpCode(r["op"].get<std::string>());
      sig.dtype = static_cast<std::uint8_t>(r["dtype"].get<std::int32_t>());
      sig.redop = static_cast<std::int16_t>(r["redop"].get<std::int32_t>());
      sig.peer = r["root"].get<std::int32_t>();
      sig.count = r["count"].get<std::uint64_t>();
      const auto n = r["n"].get<std::uint64_t>();
      calls_ += n;
      ledger_.Add(rank, *comm, nranks, r["seq"].get<std::uint64_t>(), n, sig, now_ns);
    }
  }
  const auto digests = m.find("digests");
  if (digests == m.end()) return;
  for (const json& c : *digests) {
    const std::optional<std::uint64_t> comm = protocol::ParseCommIdHex(c["id"].get<std::string>());
    if (!comm) continue;
    const auto nranks = c["nranks"].get<std::int32_t>();
    for (const json& b : c["blocks"]) {
      const std::optional<std::uint64_t> digest = protocol::ParseCommIdHex(b["digest"].get<std::string>());
      if (!digest) continue;
      const auto n = b["n"].get<std::uint64_t>();
      calls_ += n;
      blocks_.Add(rank, *comm, nranks, b["seq"].get<std::uint64_t>(), 1, BlockSignature(n, *digest), now_ns);
    }
  }
}

std::vector<HangRecord> MismatchStage::Next(const JobView& view, std::int64_t now_ns) {
  for (const analyzer::Finding& f : ledger_.Take(now_ns)) {
    const std::string id = "mismatch-" + protocol::CommIdHex(f.comm) + "-" + std::to_string(f.seq);
    records_.push_back(FindingEntry({&f}, view, now_ns, id, {}));
    recorded_.insert({f.comm, f.seq});
    recorded_order_.emplace_back(f.comm, f.seq);
    if (recorded_order_.size() > kRecordedMax) {
      recorded_.erase(recorded_order_.front());
      recorded_order_.pop_front();
    }
  }
  for (analyzer::Finding& f : blocks_.Take(now_ns)) {
    const std::string id = "mismatch-" + protocol::CommIdHex(f.comm) + "-" + std::to_string(f.seq) + "-block";
    // The ledger's words describe one call; a block's are its first and last seq and digests.
    const analyzer::CallSignature* odd = nullptr;
    const analyzer::CallSignature* common = nullptr;
    for (const auto& [rank, sig] : f.signatures) {
      const bool culprit = std::binary_search(f.culprits.begin(), f.culprits.end(), rank);
      if (culprit && odd == nullptr) odd = &sig;
      if (!culprit && common == nullptr) common = &sig;
    }
    f.summary = "calls #" + std::to_string(f.seq) + "..#" +
                std::to_string(f.seq + protocol::kSignatureBlockCalls - 1) + " on communicator " +
                protocol::CommIdHex(f.comm) + " differ between ranks";
    if (odd != nullptr && common != nullptr) {
      f.summary += ": " + DescribeBlock(*odd) + ", the others " + DescribeBlock(*common);
    }
    f.summary += " (compared by digest: raise the agents' signature_full_seqs to compare every call)";
    HangRecord rec = FindingEntry({&f}, view, now_ns, id, {});
    json evidence = json::array();
    for (const auto& [rank, sig] : f.signatures) {
      evidence.push_back({{"rank", rank}, {"calls", sig.peer}, {"digest", protocol::CommIdHex(sig.count)}});
    }
    json& detail = rec.fields["detail"];
    detail["first_seq"] = f.seq;
    detail["last_seq"] = f.seq + protocol::kSignatureBlockCalls - 1;
    detail["signatures"] = evidence;
    detail["findings"][0]["signatures"] = std::move(evidence);
    records_.push_back(std::move(rec));
  }
  std::vector<HangRecord> out;
  out.swap(records_);
  return out;
}

void MismatchStage::Unwritten(std::vector<HangRecord> records) {
  records.insert(records.end(), std::make_move_iterator(records_.begin()), std::make_move_iterator(records_.end()));
  records_ = std::move(records);
}

}  // namespace falcon::controller
