// The agent's metrics: a plain snapshot struct and its Prometheus text exposition (format
// 0.0.4). The agent loop fills a snapshot when /metrics is scraped; nothing here is shared.
// Thread-safety: value type and a pure function. Must never: do I/O.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace falcon::agent {

struct RankMetrics {
  std::int64_t rank = -1;
  std::int32_t pid = 0;
  double last_iteration_seconds = 0;  // 0 before the first sample
  std::uint64_t iterations = 0;
  std::uint64_t period = 0;           // 0 while not locked
  bool slow = false;
  std::uint32_t plan_delivered = 0;   // plan version in the rank's shared memory (0: none)
  std::uint32_t plan_applied = 0;     // highest version its framework acked as applied
  std::uint32_t plan_rejected = 0;    // highest version its framework acked as rejected
  double cost_s[4] = {-1, -1, -1, -1};    // what applying S2, S3, S4 costs it (falconReportCost); < 0: unreported
  bool stalled = false;       // StallWatch's verdict at the last check
  double quiet_seconds = 0;   // since its latest ordered NCCL call, at the last check
};

struct AgentMetrics {
  std::string job;
  std::string host;
  std::vector<RankMetrics> ranks;
  std::uint64_t records_read = 0;
  std::uint64_t records_lost = 0;
  std::uint64_t records_torn = 0;
  std::uint64_t alarms_slow = 0;
  std::uint64_t alarms_recovered = 0;
  std::uint64_t stalls = 0;        // ranks found stalled (transitions)
  std::uint64_t stalls_ended = 0;  // stalled ranks that progressed again
  std::uint64_t signature_messages = 0;  // call_signatures messages queued
  std::map<std::string, std::uint64_t> segments;  // by state: live, exited, orphaned, unreadable
  bool redis_connected = false;
  std::uint64_t outbox = 0;
  std::uint64_t outbox_dropped = 0;
  std::uint64_t published = 0;
  std::map<std::string, std::uint64_t> commands;  // by ack status
  std::uint64_t invalid_messages = 0;
  double cpu_seconds = 0;
  std::uint64_t polls = 0;
  double last_poll_seconds = 0;
};

std::string RenderPrometheus(const AgentMetrics& m);

}  // namespace falcon::agent
