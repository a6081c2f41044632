// Call signatures. See signature.h for the contract.
#include "analyzer/signature.h"

#include <array>
#include <bit>
#include <utility>

namespace falcon::analyzer {
namespace {

constexpr std::uint64_t Mix(std::uint64_t x) {
  // splitmix64 finaliser: a bijective 64-bit mixer.
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct OpName {
  std::string_view name;
  OpKind kind;
};

constexpr std::array<OpName, 13> kOpNames{{
    {"AllReduce", OpKind::kAllReduce},
    {"Broadcast", OpKind::kBroadcast},
    {"Bcast", OpKind::kBroadcast},
    {"Reduce", OpKind::kReduce},
    {"AllGather", OpKind::kAllGather},
    {"ReduceScatter", OpKind::kReduceScatter},
    {"AlltoAll", OpKind::kAllToAll},
    {"AllToAll", OpKind::kAllToAll},
    {"Gather", OpKind::kGather},
    {"Scatter", OpKind::kScatter},
    {"Send", OpKind::kSend},
    {"Recv", OpKind::kRecv},
    {"AlltoAllv", OpKind::kAllToAll},
}};

}  // namespace

OpKind ParseOpKind(std::string_view name) {
  if (name.starts_with("nccl")) {
    name.remove_prefix(4);
  }
  for (const OpName& entry : kOpNames) {
    if (entry.name == name) {
      return entry.kind;
    }
  }
  return OpKind::kOther;
}

std::uint32_t SizeClass(std::uint64_t bytes) {
  return bytes == 0 ? 0U : static_cast<std::uint32_t>(std::bit_width(bytes));
}

std::uint64_t SignatureHash(const CallRecord& call) {
  std::uint64_t h = Mix(static_cast<std::uint64_t>(call.op));
  h = Mix(h ^ call.comm);
  h = Mix(h ^ SizeClass(call.bytes));
  h = Mix(h ^ static_cast<std::uint64_t>(static_cast<std::int64_t>(call.peer)));
  return h;
}

std::uint32_t SignatureTable::Intern(std::uint64_t hash) {
  Slot& slot = cache_[hash % kCacheSlots];
  if (slot.used && slot.hash == hash) return slot.id;
  const auto next = static_cast<std::uint32_t>(ids_.size());
  const std::uint32_t id = ids_.try_emplace(hash, next).first->second;
  slot = {hash, id, true};
  return id;
}

SignatureSequence MakeSignatureSequence(std::span<const CallRecord> calls, SignatureTable& table) {
  SignatureSequence out;
  out.symbols.reserve(calls.size());
  out.t_ns.reserve(calls.size());
  for (const CallRecord& call : calls) {
    if (call.op == OpKind::kOther) {
      continue;
    }
    out.symbols.push_back(table.Intern(SignatureHash(call)));
    out.t_ns.push_back(call.t_ns);
  }
  return out;
}

}  // namespace falcon::analyzer
