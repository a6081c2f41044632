// Fuzz target: what the controller builds from Redis. The input is several message texts
// separated by 0xFF bytes (never part of a JSON text): those that validate as rank_register or
// agent_heartbeat become the job view, as RefreshView feeds it; each text is also read as the
// controller's persisted state (a restart reads whatever the state key holds) and as a job_shape.
// Checked: nothing throws or crashes; the view's tables are bounded by what was reported, not by
// the sizes the messages claim.
#include <string>
#include <vector>

#include "daemon/controller/controller_state.h"
#include "daemon/controller/job_view.h"
#include "daemon/controller/mitigation.h"
#include "daemon/protocol/validate.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace falcon;
  using fuzz::PropertyFailed;
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  std::vector<nlohmann::json> ranks, agents;
  size_t reported_members = 0;
  for (size_t start = 0; start <= all.size();) {
    size_t end = all.find('\xff', start);
    if (end == std::string_view::npos) end = all.size();
    const std::string_view text = all.substr(start, end - start);
    start = end + 1;
    if (Result<nlohmann::json> r = protocol::ParseMessage(text, protocol::kRankRegister); r.ok()) {
      if (r.value().contains("comms")) reported_members += r.value()["comms"].size();
      ranks.push_back(std::move(r).value());
    } else if (Result<nlohmann::json> a = protocol::ParseMessage(text, protocol::kAgentHeartbeat); a.ok()) {
      agents.push_back(std::move(a).value());
    }
    nlohmann::json state = nlohmann::json::parse(text, nullptr, false);
    if (!state.is_discarded()) {
      std::string why;
      const controller::ControllerState s = controller::StateFromJson(state, &why);
      (void)controller::ToJson(s).dump();
    }
    (void)controller::ParseJobShape(std::string(text));
  }
  controller::JobView view;
  for (int round = 0; round < 2; ++round) {  // the second update measures call rates
    view.Update(ranks, agents);
    size_t members = 0;
    for (const auto& [id, comm] : view.comms()) members += comm.members.size();
    // A communicator is kept only when at least 1 in 64 of its members reported it.
    if (members > 64 * (reported_members + 1)) PropertyFailed("member tables grew beyond the reports");
    (void)view.CutComm();
    (void)view.Period();
    for (const auto& [rank, info] : view.ranks()) {
      (void)view.NodeOf(rank);
      (void)view.AgentOf(rank);
    }
  }
  return 0;
}
