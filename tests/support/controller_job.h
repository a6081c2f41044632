// The controller tests' job, as the controller's view gets it: 8 ranks, TP = 2 (groups {0,1}
// {2,3} {4,5} {6,7}), DP = 4 (groups {0,2,4,6} and {1,3,5,7}) and a world communicator; ranks
// 0-3 run on node0, 4-7 on node1, one agent on each. Messages are built with the protocol's
// ToJson and validated as the controller gets them.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "daemon/controller/job_view.h"
#include "daemon/protocol/messages.h"
#include "daemon/protocol/validate.h"

namespace falcon::controller::testjob {

using nlohmann::json;

inline constexpr std::int64_t kT0 = 1'795'264'878'000'000'000;  // wall ns
inline constexpr std::int64_t kSec = 1'000'000'000;

inline constexpr std::int64_t kRanks = 8;
inline constexpr std::uint64_t kWorld = 0x00000000000abcdeULL;
inline std::uint64_t TpId(std::int64_t group) { return 0x7b0b545ea07b0000ULL + static_cast<std::uint64_t>(group); }
inline std::uint64_t DpId(std::int64_t group) { return 0x0dae3e2e976b0000ULL + static_cast<std::uint64_t>(group); }
inline std::string HostOfRank(std::int64_t r) { return r < 4 ? "node0" : "node1"; }

// As the controller gets it: serialised, parsed and validated against `spec`.
inline json Validated(const json& m, const protocol::MessageSpec& spec) {
  Result<json> r = protocol::ParseMessage(m.dump(), spec);
  EXPECT_TRUE(r.ok()) << r.status().ToString() << ": " << m.dump();
  return r.ok() ? std::move(r).value() : json::object();
}

struct RankSpec {
  std::int64_t rank = 0;
  std::string host = "node0";
  std::vector<protocol::CommSummary> comms;
  std::int64_t at_ns = kT0;
  std::string state = "live";
  std::optional<std::uint64_t> period = std::nullopt;
  std::int64_t pid = 0;  // 0: 1000 + rank
};

inline json RankMsg(const RankSpec& s) {
  protocol::RankRegistration m;
  m.header = {"job", s.host, s.at_ns};
  m.rank = s.rank;
  m.pid = s.pid != 0 ? s.pid : 1000 + (s.rank < 0 ? 99 : s.rank);
  m.state = s.state;
  m.started_ns = kT0 - 60 * kSec;
  m.comms = s.comms;
  m.period = s.period;
  return Validated(protocol::ToJson(m), protocol::kRankRegister);
}

inline json AgentMsg(const std::string& host, bool broadcast = false) {
  protocol::AgentHeartbeat m;
  m.header = {"job", host, kT0};
  m.pid = 42;
  m.version = "0.1.0";
  m.broadcast = broadcast;
  return Validated(protocol::ToJson(m), protocol::kAgentHeartbeat);
}

inline std::vector<protocol::CommSummary> JobCommsOf(std::int64_t r, std::uint64_t calls) {
  const auto rank = static_cast<std::int32_t>(r);
  return {{kWorld, rank, kRanks, "world", calls},
          {TpId(r / 2), rank % 2, 2, "tp", calls},
          {DpId(r % 2), rank / 2, 4, "dp", calls}};
}

// Registrations of the test job; `state_of` overrides a rank's state.
inline std::vector<json> JobRanks(std::uint64_t calls, std::int64_t at_ns,
                           const std::map<std::int64_t, std::string>& state_of = {}) {
  std::vector<json> out;
  for (std::int64_t r = 0; r < kRanks; ++r) {
    auto s = state_of.find(r);
    out.push_back(RankMsg({r, HostOfRank(r), JobCommsOf(r, calls), at_ns,
                           s == state_of.end() ? "live" : s->second, 9}));
  }
  return out;
}

// The job's two agents; `broadcast`: both read the broadcast command stream.
inline std::vector<json> JobAgents(bool broadcast = false) {
  return {AgentMsg("node0", broadcast), AgentMsg("node1", broadcast)};
}

// The test job seen twice, one second apart: every communicator at 100 calls/s, 1100 calls in.
inline JobView RunningJob(const std::map<std::int64_t, std::string>& state_of = {}, bool broadcast = false) {
  JobView v;
  v.Update(JobRanks(1000, kT0, state_of), JobAgents(broadcast));
  v.Update(JobRanks(1100, kT0 + kSec, state_of), JobAgents(broadcast));
  return v;
}

}  // namespace falcon::controller::testjob
