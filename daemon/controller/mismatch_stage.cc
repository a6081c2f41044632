// MismatchStage. See mismatch_stage.h for the contract.
#include "daemon/controller/mismatch_stage.h"

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

}  // namespace

MismatchStage::MismatchStage(MismatchStageOptions options)
    : ledger_(analyzer::CallLedgerOptions{static_cast<std::int64_t>(options.grace_s * 1e9), 16384,
                                          60'000'000'000, options.max_per_comm}) {}

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
  std::vector<HangRecord> out;
  out.swap(records_);
  return out;
}

void MismatchStage::Unwritten(std::vector<HangRecord> records) {
  records.insert(records.end(), std::make_move_iterator(records_.begin()), std::make_move_iterator(records_.end()));
  records_ = std::move(records);
}

}  // namespace falcon::controller
