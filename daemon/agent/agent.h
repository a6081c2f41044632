// Agent: falcon-agent's event loop state (DESIGN.md "The agent"). One Boost.Asio loop thread
// owns everything here; a fixed-rate tick (poll_ms, like Redis's cron) discovers shim segments,
// reads new call records of every followed rank, runs the per-rank analysis, resolves pending
// command acks and, when due, queues heartbeats, iteration batches and profiles. While a command
// waits on the shims a second timer checks their answers every command_poll_ms and an ack is
// flushed at once: a validation is a chain of such round trips with the job paused. Redis I/O runs
// on two named workers (ReportPublisher "redis-pub", CommandReader "redis-cmd") whose results
// come back as posted events; the metrics endpoint is asynchronous on the same loop. When Redis
// is down the agent keeps reading and analysing; reports wait in the bounded outbox.
// Thread-safety: construct, Start(), Stop() and every handler on the loop thread
// (io_context::run() in one thread). Invariants:
//  1. followers_, pending batches, counters: loop thread only.
//  2. Workers never touch Agent state; their results arrive through boost::asio::post.
//  3. Stop() joins the workers before members are destroyed; posted results after that are
//     ignored (alive flags in the publisher and reader).
// Must never: block the loop (no Redis call, no sleep), trust data read from Redis, or write to a
// segment anything but cursors, control-block requests (mode, trap) and plans (plan_delivery.h).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/logger.h>

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/agent/agent_config.h"
#include "daemon/agent/command_executor.h"
#include "daemon/agent/command_reader.h"
#include "daemon/common/http_server.h"
#include "daemon/common/prometheus_text.h"
#include "daemon/agent/metrics.h"
#include "daemon/agent/rank_follower.h"
#include "daemon/agent/report_publisher.h"
#include "daemon/agent/stall_watch.h"
#include "daemon/protocol/rank_beat.h"

namespace falcon::agent {

inline constexpr const char* kAgentVersion = "0.1.0";

// What main() resolves before building the agent (no environment reads inside).
struct AgentEnvironment {
  std::string host;     // node name (config host, else hostname)
  std::string shm_dir;  // config shm_dir, else $FALCON_SHM_DIR, else /dev/shm
  std::uint32_t uid = 0;
  std::int32_t pid = 0;
};

class Agent {
 public:
  using Clock = std::chrono::steady_clock;

  Agent(boost::asio::io_context& io, const AgentConfig& config, const AgentEnvironment& env,
        std::shared_ptr<spdlog::logger> log);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Validates names, starts the metrics endpoint and the Redis workers, schedules the first tick.
  [[nodiscard]] Status Start();
  // Stops timers, the endpoint and the workers (joined). Idempotent.
  void Stop();

  int metrics_port() const { return http_ ? http_->port() : 0; }
  AgentMetrics Snapshot() const;

 private:
  struct Followed {
    std::unique_ptr<RankFollower> follower;
    std::vector<RankSample> batch;  // samples not yet queued
    double last_seconds = 0;
    // Plan version, framework ack count and cost reports last registered: a change re-registers at once.
    std::uint32_t plan_registered = 0;
    std::uint64_t acks_registered = 0;
    std::array<double, 4> costs_registered{-1, -1, -1, -1};  // falconReportCost figures last registered
    StallWatch stall;
    // The open profile window: when it began (wall ns), the mode then, when it is due.
    std::int64_t profile_since_ns = 0;
    std::string profile_mode;
    Clock::time_point next_profile{};
    // When its rank key is written, and its counters for the agent key (rank_beat.h).
    protocol::RankKeyWriter key_writer;
    std::optional<protocol::RankBeat> beat;  // unset until it has a rank
  };

  void Tick();
  void WatchCommands();  // arms command_timer_ while the executor has commands outstanding
  void Discover();
  void Follow(const daemon::SegmentInfo& info);
  void Unfollow(const std::string& path, const char* state);
  void Poll(Followed& f, daemon::SegmentReader::ReadMode mode);
  std::vector<RankFollower*> Followers() const;

  // agent_reports.cc: what goes to Redis.
  void QueueBatch(Followed& f);
  void QueueAlarm(const RankFollower& f, const RankAlarm& a);
  void CheckStalls();
  void QueueSignatures();  // every signature_ms: each rank's new collectives (call_signatures)
  void QueueSignatures(RankFollower& r);  // every stall_check_ms: each rank's StallWatch, transitions reported
  void QueueStall(const RankFollower& f, const StallEvent& e);
  // Writes f's rank key if its content changed or its TTL is due, and takes its beat.
  void QueueRegistration(Followed& f);
  // Every followed rank's registration, then the agent key with their beats.
  void Heartbeat();
  // Closes f's profile window at `until_ns` (published unless empty) and opens the next, in the
  // mode the shim is in now. Every profile_ms, and at each set_mode the rank applied: a window
  // never spans a mode switch, so the first window after a switch to profile holds only timed
  // calls and arrives profile_ms after the switch.
  void CloseProfileWindow(Followed& f, std::int64_t until_ns, Clock::time_point now);
  void OnCommand(const std::string& entry_id, const Result<protocol::Command>& command,
                 const std::optional<protocol::CommandIdentity>& identity);
  void TrackPlans();  // late plan delivery and prompt re-registration on framework acks
  void OnPlanInForce(const std::string& text);
  void OnAck(const std::string& entry_id, const protocol::Command& c, const CommandOutcome& o);
  protocol::ReportHeader Header() const;
  std::string Key(const protocol::KeySpec& spec, std::int64_t rank = -1) const;

  boost::asio::io_context& io_;
  const AgentConfig config_;
  const AgentEnvironment env_;
  std::shared_ptr<spdlog::logger> log_;
  boost::asio::steady_timer timer_;
  boost::asio::steady_timer command_timer_;
  bool command_timer_armed_ = false;
  std::unique_ptr<ReportPublisher> publisher_;
  std::unique_ptr<CommandReader> reader_;
  std::unique_ptr<CommandExecutor> executor_;
  std::unique_ptr<daemon::HttpServer> http_;
  FollowerOptions follower_options_;

  std::map<std::string, Followed> followers_;  // by segment path
  std::set<std::string> ignored_;     // paths not followed (other job, open failed)
  std::set<std::string> unreadable_;  // paths listed as unreadable (logged once, retried)
  std::map<std::string, std::uint64_t> segment_counts_;
  Clock::time_point next_tick_{};
  Clock::time_point next_heartbeat_{}, next_flush_{}, next_stall_check_{}, next_signatures_{};
  std::int64_t started_real_ns_ = 0;
  bool started_ = false;
  bool stopped_ = false;
  // Counters (invariant 1).
  std::uint64_t records_read_ = 0, records_lost_ = 0, records_torn_ = 0;
  std::uint64_t alarms_slow_ = 0, alarms_recovered_ = 0;
  std::uint64_t signature_messages_ = 0;
  std::uint64_t stalls_ = 0, stalls_ended_ = 0;
  std::uint64_t invalid_messages_ = 0, polls_ = 0;
  std::map<std::string, std::uint64_t> commands_;
  double last_poll_seconds_ = 0;
};

// Wall clock now, ns since the epoch.
std::int64_t RealNowNs();
using daemon::ProcessCpuSeconds;  // daemon/common/prometheus_text.h

}  // namespace falcon::agent
