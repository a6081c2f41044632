// Agent: lifecycle, the tick, segment discovery and record polling. Reports and commands are in
// agent_reports.cc. See agent.h for the contract.
#include "daemon/agent/agent.h"

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <iterator>

#include "daemon/agent/shim_trap.h"
#include "daemon/common/log_escape.h"
#include "daemon/protocol/keys.h"

namespace falcon::agent {

std::int64_t RealNowNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace {

redis::RedisOptions RedisFrom(const AgentConfig& c) {
  redis::RedisOptions o;
  o.host = c.redis_host;
  o.port = static_cast<int>(c.redis_port);
  o.user = c.redis_user;
  o.password = c.redis_password;
  o.db = static_cast<int>(c.redis_db);
  o.connect_timeout_ms = static_cast<int>(c.redis_connect_timeout_ms);
  o.command_timeout_ms = static_cast<int>(c.redis_timeout_ms);
  o.backoff_min_ms = static_cast<int>(c.redis_backoff_min_ms);
  o.backoff_max_ms = static_cast<int>(c.redis_backoff_max_ms);
  return o;
}

FollowerOptions FollowerFrom(const AgentConfig& c) {
  FollowerOptions o;
  o.read_batch = static_cast<std::size_t>(c.read_batch);
  o.analysis.tracker.period.acf_threshold = c.acf_threshold;
  o.analysis.tracker.window = static_cast<std::size_t>(c.tracker_window);
  o.analysis.detector.min_change = c.min_change;
  o.analysis.detector.cp_threshold = c.cp_threshold;
  o.analysis.detector.rho_floor = c.rho_floor;
  o.analysis.series.keep_cycles = static_cast<std::size_t>(c.series_cycles);
  o.analysis.series.extract_every_ns = c.series_every_ms * 1'000'000;
  o.analysis.history_calls = static_cast<std::size_t>(c.history_calls);
  o.signatures.full_seqs = static_cast<std::uint64_t>(c.signature_full_seqs);
  return o;
}

}  // namespace

Agent::Agent(boost::asio::io_context& io, const AgentConfig& config, const AgentEnvironment& env,
             std::shared_ptr<spdlog::logger> log)
    : io_(io),
      config_(config),
      env_(env),
      log_(std::move(log)),
      timer_(io),
      command_timer_(io),
      follower_options_(FollowerFrom(config)) {}

Agent::~Agent() { Stop(); }

std::string Agent::Key(const protocol::KeySpec& spec, std::int64_t rank) const {
  protocol::KeyVars vars{config_.job, env_.host, {}};
  if (rank >= 0) vars.rank = rank;
  Result<std::string> key = protocol::FormatKey(spec, vars);
  // Start() checked job and host, so only a negative rank can fail; callers skip those.
  return key.ok() ? key.value() : std::string();
}

Status Agent::Start() {
  if (!protocol::ValidKeyPart(config_.job)) {
    return Status::InvalidArgument("job '" + config_.job + "' must be 1..128 of [A-Za-z0-9._-]");
  }
  if (!protocol::ValidKeyPart(env_.host)) {
    return Status::InvalidArgument("host '" + env_.host + "' must be 1..128 of [A-Za-z0-9._-]");
  }
  const redis::RedisOptions redis = RedisFrom(config_);
  publisher_ = std::make_unique<ReportPublisher>(
      io_, redis,
      PublisherOptions{static_cast<std::uint64_t>(config_.stream_maxlen),
                       static_cast<std::size_t>(config_.outbox_max),
                       static_cast<std::size_t>(config_.flush_batch)},
      log_);
  std::unique_ptr<TrapController> trap;
  if (config_.trap_backend == "shim") {
    trap = std::make_unique<ShimTrap>(ShimTrapOptions{std::chrono::milliseconds(config_.trap_wait_ms)});
  } else {
    trap = std::make_unique<UnsupportedTrap>();
  }
  executor_ = std::make_unique<CommandExecutor>(
      std::move(trap), std::chrono::milliseconds(config_.mode_ack_timeout_ms),
      [this](const std::string& id, const protocol::Command& c, const CommandOutcome& o) {
        OnAck(id, c, o);
      });
  CommandReaderOptions ro;
  ro.stream = Key(protocol::kCommandsStream);
  ro.broadcast_stream = Key(protocol::kBroadcastStream);
  ro.consumer = env_.host;
  ro.block_ms = static_cast<int>(config_.command_block_ms);
  ro.plan_key = Key(protocol::kPlanKey);
  reader_ = std::make_unique<CommandReader>(
      io_, redis, ro,
      [this](const std::string& id, const Result<protocol::Command>& c,
             const std::optional<protocol::CommandIdentity>& identity) { OnCommand(id, c, identity); },
      log_);
  reader_->OnPlanInForce([this](const std::string& text) { OnPlanInForce(text); });
  if (config_.metrics_port > 0) {
    http_ = std::make_unique<daemon::HttpServer>(
        io_, [this] { return RenderPrometheus(Snapshot()); },
        [this] {
          return std::string("ok\nredis ") + (publisher_->connected() ? "up" : "down") + "\nranks " +
                 std::to_string(followers_.size()) + "\n";
        });
    Status s = http_->Start(config_.metrics_address, static_cast<int>(config_.metrics_port));
    if (!s.ok()) return s;
  }
  publisher_->Start();
  reader_->Start();
  started_real_ns_ = RealNowNs();
  const auto now = Clock::now();
  next_tick_ = now;
  next_heartbeat_ = now;
  next_flush_ = now + std::chrono::milliseconds(config_.flush_ms);
  next_stall_check_ = now + std::chrono::milliseconds(config_.stall_check_ms);
  next_signatures_ = now + std::chrono::milliseconds(config_.signature_ms);
  started_ = true;
  log_->info("event=start version={} job={} host={} shm_dir={} redis={} metrics_port={}", kAgentVersion,
             daemon::LogValue(config_.job), daemon::LogValue(env_.host), daemon::LogValue(env_.shm_dir),
             daemon::LogQuoted(redis.Describe()), metrics_port());
  Tick();
  return Status::Ok();
}

void Agent::Stop() {
  if (stopped_) return;
  stopped_ = true;
  timer_.cancel();
  command_timer_.cancel();
  if (http_) http_->Stop();
  if (reader_) reader_->Stop();
  if (!started_) return;
  // Last words: what is queued, with a short budget (the loop no longer runs, so waiting here
  // blocks nothing else).
  for (auto& [path, f] : followers_) QueueBatch(f);
  const std::size_t left = publisher_->FinalFlush(std::chrono::milliseconds(1500));
  publisher_->Stop();
  log_->info("event=stop ranks={} unsent={} dropped={}", followers_.size(), left,
             publisher_->dropped());
}

void Agent::Tick() {
  if (stopped_) return;
  const auto t0 = Clock::now();
  ++polls_;
  Discover();
  for (auto& [path, f] : followers_) Poll(f, daemon::SegmentReader::ReadMode::kLive);
  executor_->Check(t0);
  WatchCommands();
  TrackPlans();
  if (t0 >= next_heartbeat_) {
    next_heartbeat_ = t0 + std::chrono::milliseconds(config_.heartbeat_ms);
    Heartbeat();
  }
  if (config_.stall_check_ms > 0 && t0 >= next_stall_check_) {
    next_stall_check_ = t0 + std::chrono::milliseconds(config_.stall_check_ms);
    CheckStalls();
  }
  if (config_.signature_ms > 0 && t0 >= next_signatures_) {
    next_signatures_ = t0 + std::chrono::milliseconds(config_.signature_ms);
    QueueSignatures();
  }
  if (config_.profile_ms > 0) {
    for (auto& [path, f] : followers_) {
      if (t0 >= f.next_profile) CloseProfileWindow(f, RealNowNs(), t0);
    }
  }
  if (t0 >= next_flush_) {
    next_flush_ = t0 + std::chrono::milliseconds(config_.flush_ms);
    for (auto& [path, f] : followers_) QueueBatch(f);
    publisher_->Flush();
  }
  last_poll_seconds_ = std::chrono::duration<double>(Clock::now() - t0).count();
  // Fixed rate; if a tick overran, the next starts now rather than bursting to catch up.
  next_tick_ = std::max(next_tick_ + std::chrono::milliseconds(config_.poll_ms), Clock::now());
  timer_.expires_at(next_tick_);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Tick();
  });
}

void Agent::WatchCommands() {
  if (stopped_ || command_timer_armed_ || executor_->pending() == 0) return;
  command_timer_armed_ = true;
  command_timer_.expires_after(std::chrono::milliseconds(config_.command_poll_ms));
  command_timer_.async_wait([this](const boost::system::error_code& ec) {
    command_timer_armed_ = false;
    if (ec || stopped_) return;
    executor_->Check(Clock::now());
    WatchCommands();
  });
}

void Agent::Discover() {
  Result<std::vector<daemon::SegmentInfo>> listed =
      daemon::ListSegments(env_.shm_dir, env_.uid, /*all_users=*/false);
  if (!listed.ok()) {
    log_->warn("event=discover_failed dir={} reason={}", daemon::LogValue(env_.shm_dir),
               daemon::LogQuoted(listed.status().message()));
    return;
  }
  segment_counts_.clear();
  std::set<std::string> present;
  for (const daemon::SegmentInfo& info : listed.value()) {
    ++segment_counts_[daemon::SegmentStateName(info.state)];
    present.insert(info.path);
    const bool followed = followers_.count(info.path) != 0;
    switch (info.state) {
      case daemon::SegmentInfo::State::kLive:
        if (!followed && ignored_.count(info.path) == 0) Follow(info);
        break;
      case daemon::SegmentInfo::State::kExited:
        if (followed) Unfollow(info.path, "exited");
        break;
      case daemon::SegmentInfo::State::kOrphaned:
        if (followed) Unfollow(info.path, "orphaned");
        if (config_.reap_orphans) {
          Status s = daemon::ReapSegment(info);
          if (s.ok()) {
            log_->info("event=reap path={} pid={}", daemon::LogValue(info.path), info.pid);
          } else {  // retried next tick; usually a segment of another user's we may not unlink
            log_->debug("event=reap_failed path={} reason={}", daemon::LogValue(info.path),
                        daemon::LogQuoted(s.message()));
          }
        }
        break;
      case daemon::SegmentInfo::State::kUnreadable:
        // Often a segment still being initialised: retried every tick, logged once.
        if (unreadable_.insert(info.path).second) {
          log_->debug("event=segment_unreadable path={} reason={}", daemon::LogValue(info.path),
                      daemon::LogQuoted(info.error));
        }
        break;
    }
  }
  // Segments the shim unlinked at a normal exit: we still hold the mapping; read it to the end.
  std::vector<std::string> gone;
  for (const auto& [path, f] : followers_) {
    if (present.count(path) == 0) gone.push_back(path);
  }
  for (const std::string& path : gone) Unfollow(path, "exited");
  for (auto* set : {&ignored_, &unreadable_}) {
    for (auto it = set->begin(); it != set->end();) {
      it = present.count(*it) ? std::next(it) : set->erase(it);
    }
  }
}

void Agent::Follow(const daemon::SegmentInfo& info) {
  if (!info.job.empty() && info.job != config_.job) {
    ignored_.insert(info.path);
    log_->info("event=skip_segment path={} pid={} job={} reason=\"other job\"", daemon::LogValue(info.path),
               info.pid, daemon::LogValue(info.job));
    return;
  }
  Result<std::unique_ptr<RankFollower>> f = RankFollower::Open(info, follower_options_);
  if (!f.ok()) {
    ignored_.insert(info.path);
    log_->warn("event=segment_open_failed path={} reason={}", daemon::LogValue(info.path),
               daemon::LogQuoted(f.status().message()));
    return;
  }
  RankFollower& r = *f.value();
  log_->info("event=follow pid={} rank={} exe={} path={} writable={}", r.pid(), r.rank(),
             daemon::LogValue(info.exe), daemon::LogValue(info.path), r.writable());
  Followed& slot = followers_[info.path];
  slot.follower = std::move(f).value();
  slot.stall = StallWatch(StallOptions{config_.stall_floor_s, config_.stall_factor, config_.stall_startup_s});
  slot.profile_since_ns = RealNowNs();
  slot.profile_mode = slot.follower->mode_name();
  slot.next_profile = Clock::now() + std::chrono::milliseconds(config_.profile_ms);
  Poll(slot, daemon::SegmentReader::ReadMode::kLive);
  Heartbeat();  // the new rank's key, and the agent key that lists it
}

void Agent::Unfollow(const std::string& path, const char* state) {
  auto it = followers_.find(path);
  if (it == followers_.end()) return;
  Followed& f = it->second;
  Poll(f, daemon::SegmentReader::ReadMode::kFinal);
  QueueBatch(f);
  QueueSignatures(*f.follower);
  if (config_.profile_ms > 0) CloseProfileWindow(f, RealNowNs(), Clock::now());  // its last calls' profile
  f.follower->state = state;
  QueueRegistration(f);
  log_->info("event=unfollow pid={} rank={} state={} records={} lost={} iterations={}",
             f.follower->pid(), f.follower->rank(), state, f.follower->records(),
             f.follower->lost(), f.follower->analysis().samples());
  executor_->Forget(f.follower.get());
  followers_.erase(it);
  Heartbeat();  // the agent key without it
}

void Agent::Poll(Followed& f, daemon::SegmentReader::ReadMode mode) {
  FollowerUpdate u;
  f.follower->Poll(mode, &u);
  records_read_ += u.stats.read;
  records_lost_ += u.stats.lost;
  records_torn_ += u.stats.torn;
  RankFollower& r = *f.follower;
  for (std::size_t period : u.analysis.locks) {
    log_->info("event=period_locked pid={} rank={} period={}", r.pid(), r.rank(), period);
  }
  if (u.analysis.losses > 0) log_->info("event=period_lost pid={} rank={}", r.pid(), r.rank());
  if (!u.analysis.samples.empty()) f.last_seconds = u.analysis.samples.back().seconds;
  f.batch.insert(f.batch.end(), u.analysis.samples.begin(), u.analysis.samples.end());
  for (const RankAlarm& a : u.analysis.alarms) {
    QueueBatch(f);  // samples up to the alarm go out before it
    QueueAlarm(r, a);
  }
}

std::vector<RankFollower*> Agent::Followers() const {
  std::vector<RankFollower*> out;
  for (const auto& [path, f] : followers_) out.push_back(f.follower.get());
  return out;
}

AgentMetrics Agent::Snapshot() const {
  AgentMetrics m;
  m.job = config_.job;
  m.host = env_.host;
  for (const auto& [path, f] : followers_) {
    const RankAnalysis& a = f.follower->analysis();
    const daemon::PlanAcks acks = f.follower->plan_acks();
    RankMetrics& r = m.ranks.emplace_back(RankMetrics{f.follower->rank(), f.follower->pid(), f.last_seconds,
                                                      a.samples(), a.locked() ? a.period() : 0, a.slow(),
                                                      f.follower->plan_version(), acks.applied, acks.rejected});
    r.stalled = f.stall.stalled();
    r.quiet_seconds = f.stall.age_s();
    std::copy(std::begin(acks.cost_s), std::end(acks.cost_s), std::begin(r.cost_s));
  }
  m.records_read = records_read_;
  m.records_lost = records_lost_;
  m.records_torn = records_torn_;
  m.alarms_slow = alarms_slow_;
  m.alarms_recovered = alarms_recovered_;
  m.stalls = stalls_;
  m.stalls_ended = stalls_ended_;
  m.signature_messages = signature_messages_;
  m.segments = segment_counts_;
  m.redis_connected = publisher_ && publisher_->connected();
  m.outbox = publisher_ ? publisher_->outbox_size() : 0;
  m.outbox_dropped = publisher_ ? publisher_->dropped() : 0;
  m.published = publisher_ ? publisher_->published() : 0;
  m.commands = commands_;
  m.invalid_messages = invalid_messages_;
  m.cpu_seconds = ProcessCpuSeconds();
  m.polls = polls_;
  m.last_poll_seconds = last_poll_seconds_;
  return m;
}

}  // namespace falcon::agent
