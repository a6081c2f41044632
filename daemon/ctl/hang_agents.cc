// `falcon-ctl hang --agents`: see hang_agents.h.
#include "daemon/ctl/hang_agents.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <set>

#include "daemon/shm/progress_json.h"

namespace falcon::ctl {

using nlohmann::json;

Result<HangInput> LoadAgentsProgress(AgentsProgressOptions options) {
  if (Status s = ResolveRedisOptions(options.redis); !s.ok()) return s;
  auto conn = ConnectRedis(options.redis);
  if (!conn.ok()) return conn.status();
  protocol::Command cmd;
  cmd.type = std::string(protocol::kProgressCommand.type);
  cmd.calls = options.calls;
  Result<std::vector<AgentAnswer>> answers = AskAgents(*conn.value(), options.redis, cmd);
  if (!answers.ok()) return answers.status();
  json ranks = json::array();
  std::vector<std::int64_t> paused;
  double quiet = -1;
  std::size_t answered = 0;
  std::set<std::int64_t> seen;
  for (const AgentAnswer& a : answers.value()) {
    if (!a.ack) {
      std::fprintf(stderr, "falcon-ctl hang: agent %s did not answer within %.1f s: its ranks are missing\n",
                   a.host.c_str(), options.redis.timeout_s);
      continue;
    }
    ++answered;
    const json& ack = *a.ack;
    if (ack["status"] != "ok") {
      std::fprintf(stderr, "falcon-ctl hang: agent %s: %s: %s\n", a.host.c_str(),
                   ack["status"].get<std::string>().c_str(), ack.value("detail", std::string()).c_str());
    }
    for (const json& r : ack.value("results", json::array())) {
      if (!r.contains("progress") || !r["progress"].is_object()) continue;
      // Each rank is checked alone, so that one bad rank does not cost the others.
      json one = r["progress"];
      std::string error;
      const std::optional<analyzer::RankProgress> parsed = daemon::ParseProgressRank(one, &error);
      if (!parsed) {
        std::fprintf(stderr, "falcon-ctl hang: agent %s sent a bad progress for rank %lld: %s (left out)\n",
                     a.host.c_str(), static_cast<long long>(r["rank"].get<std::int64_t>()), error.c_str());
        continue;
      }
      if (!seen.insert(parsed->rank).second) continue;  // a rank twice: the first wins
      if (one.value("paused", false)) paused.push_back(parsed->rank);
      const json* q = one.contains("quiet_s") ? &one["quiet_s"] : nullptr;
      if (q != nullptr && q->is_number() && q->get<double>() >= 0 && (quiet < 0 || q->get<double>() < quiet)) {
        quiet = q->get<double>();
      }
      ranks.push_back(std::move(one));
    }
  }
  if (answered == 0) {
    return Status::NotFound("no agent of job '" + options.redis.job + "' answered within " +
                            std::to_string(options.redis.timeout_s) + " s");
  }
  const json doc = {{"format", "falcon-progress"}, {"version", daemon::kProgressFormatVersion},
                    {"source", "agents"}, {"ranks", std::move(ranks)}};
  Result<HangInput> in = ParseHangDocument(doc.dump(), "agents of job " + options.redis.job);
  if (!in.ok()) return in.status();
  std::sort(paused.begin(), paused.end());
  in.value().paused_ranks = std::move(paused);
  in.value().quiet_s = quiet;
  in.value().origin = std::to_string(answered) + " of " + std::to_string(answers.value().size()) +
                      " agent(s) of job " + options.redis.job + " (Redis)";
  return in;
}

}  // namespace falcon::ctl
