// Agent: what goes to Redis (registrations, heartbeats, iteration batches, alarms, stall
// reports, profiles, acks, alerts) and what comes from it (commands). Every message is built
// from the typed protocol structs (daemon/protocol/messages.h); every key from FormatKey. See
// agent.h.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <time.h>
#include <unistd.h>

#include "daemon/agent/agent.h"
#include "daemon/agent/plan_delivery.h"
#include "daemon/common/log_escape.h"
#include "daemon/protocol/keys.h"

namespace falcon::agent {
namespace {
constexpr std::size_t kMaxBatch = 4096;  // samples per iterations message
}

protocol::ReportHeader Agent::Header() const { return {config_.job, env_.host, RealNowNs()}; }

void Agent::QueueBatch(Followed& f) {
  if (f.batch.empty()) return;
  const RankFollower& r = *f.follower;
  const std::int64_t offset = r.real_minus_mono_ns();
  for (std::size_t begin = 0; begin < f.batch.size(); begin += kMaxBatch) {
    const std::size_t end = std::min(f.batch.size(), begin + kMaxBatch);
    protocol::IterationBatch b;
    b.header = Header();
    b.rank = r.rank();
    b.pid = r.pid();
    b.period = std::max<std::uint64_t>(1, f.batch[begin].period);
    b.first = f.batch[begin].index;
    for (std::size_t i = begin; i < end; ++i) {
      b.start_ns.push_back(f.batch[i].start_ns + offset);
      b.seconds.push_back(f.batch[i].seconds);
    }
    publisher_->Queue(Key(protocol::kIterationsStream), protocol::ToJson(b), /*packable=*/true);
  }
  f.batch.clear();
}

void Agent::QueueAlarm(const RankFollower& r, const RankAlarm& a) {
  const bool slow = a.alarm.type == analyzer::AlarmType::kSlow;
  ++(slow ? alarms_slow_ : alarms_recovered_);
  protocol::AlarmReport m;
  m.header = Header();
  m.rank = r.rank();
  m.pid = r.pid();
  m.kind = slow ? "slow" : "recovered";
  m.onset = a.alarm.onset;
  m.at = a.alarm.at;
  if (a.onset_ns) m.onset_ns = *a.onset_ns + r.real_minus_mono_ns();
  m.ratio = std::isfinite(a.alarm.ratio) ? a.alarm.ratio : 0;
  m.probability = std::isfinite(a.alarm.probability) ? std::clamp(a.alarm.probability, 0.0, 1.0) : 0;
  m.level_s = a.alarm.level_seconds;
  m.baseline_s = a.baseline_seconds;
  publisher_->Queue(Key(protocol::kAlarmsStream), protocol::ToJson(m), /*packable=*/true);
  log_->warn("event=alarm kind={} pid={} rank={} onset={} at={} ratio={:.3f} level_s={:.6f} "
             "baseline_s={:.6f}", m.kind, m.pid, m.rank, m.onset, m.at, m.ratio, m.level_s,
             m.baseline_s);
  protocol::Alert alert;
  alert.job = config_.job;
  alert.at_ns = m.header.at_ns;
  alert.severity = slow ? "warning" : "info";
  alert.source = "agent";
  char summary[160];
  std::snprintf(summary, sizeof summary, "rank %lld on %s %s: %.2fx its healthy iteration time",
                static_cast<long long>(m.rank), env_.host.c_str(),
                slow ? "is slow" : "recovered", m.ratio);
  alert.summary = summary;
  alert.host = env_.host;
  alert.rank = m.rank;
  publisher_->Publish(Key(protocol::kAlertsChannel), protocol::ToJson(alert));
}

void Agent::QueueRegistration(Followed& f) {
  const RankFollower& r = *f.follower;
  if (r.rank() < 0) return;  // no rank yet: registered once a communicator names it
  protocol::RankRegistration m = r.Registration();
  m.header = Header();
  protocol::RankBeat beat;
  const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  if (f.key_writer.Next(m, now, config_.key_ttl_s * 1'000'000'000, config_.heartbeat_ms * 1'000'000, beat)) {
    publisher_->SetHash(Key(protocol::kRankKey, r.rank()),
                        {{std::string(protocol::kPayloadField), f.key_writer.payload()},
                         {"host", env_.host},
                         {"pid", std::to_string(m.pid)},
                         {"state", m.state}},
                        config_.key_ttl_s);
  }
  f.beat = std::move(beat);
}

void Agent::Heartbeat() {
  protocol::AgentHeartbeat h;
  h.beats.emplace();
  for (auto& [path, f] : followers_) {
    QueueRegistration(f);
    h.ranks.push_back(f.follower->rank());
    if (f.follower->rank() >= 0 && f.beat) h.beats->push_back(*f.beat);
  }
  h.header = Header();
  h.pid = env_.pid;
  h.version = kAgentVersion;
  h.started_ns = started_real_ns_;
  h.cpu_seconds = ProcessCpuSeconds();
  h.outbox = publisher_->outbox_size();
  h.dropped = publisher_->dropped();
  h.broadcast = true;  // the command reader reads falcon:{job}:broadcast beside its own stream
  publisher_->SetHash(Key(protocol::kAgentKey),
                      {{std::string(protocol::kPayloadField), protocol::ToJson(h).dump()},
                       {"pid", std::to_string(env_.pid)}},
                      config_.key_ttl_s);
}

void Agent::CloseProfileWindow(Followed& f, std::int64_t until_ns, Clock::time_point now) {
  std::vector<CommStats> comms = f.follower->TakeProfile();
  if (!comms.empty()) {
    protocol::CommProfileReport m;
    m.header = Header();
    m.rank = f.follower->rank();
    m.pid = f.follower->pid();
    m.since_ns = f.profile_since_ns;
    m.mode = f.profile_mode;
    for (const CommStats& c : comms) {
      protocol::CommProfile p{c.id, c.rank, c.nranks, {}};
      for (const SignatureStats& s : c.sigs) {
        protocol::SignatureProfile sp{s.op, s.bytes, s.peer, s.count, {}, {}, {}};
        if (s.timed > 0) {
          sp.mean_us = s.mean_us;
          sp.median_us = s.median_us;
          // Mostly device times, or host times: a mix (events failing now and then) is named
          // by what most of the samples are.
          sp.clock = 2 * s.device >= s.timed ? "device" : "host";
        }
        p.sigs.push_back(std::move(sp));
      }
      m.comms.push_back(std::move(p));
    }
    publisher_->Queue(Key(protocol::kProfilesStream), protocol::ToJson(m), /*packable=*/true);
  }
  f.profile_since_ns = until_ns;
  f.profile_mode = f.follower->mode_name();
  f.next_profile = now + std::chrono::milliseconds(config_.profile_ms);
}

void Agent::OnCommand(const std::string& entry_id, const Result<protocol::Command>& command,
                      const std::optional<protocol::CommandIdentity>& identity) {
  if (!command.ok()) {
    ++invalid_messages_;
    if (identity) {  // its sender waits for an answer: a rejection naming the error
      log_->warn("event=command_rejected entry={} id={} type={} reason={}", daemon::LogValue(entry_id),
                 daemon::LogValue(identity->id), daemon::LogValue(identity->type),
                 daemon::LogQuoted(command.status().message()));
      protocol::Command c;
      c.type = identity->type;
      c.id = identity->id;
      OnAck(entry_id, c, {"rejected", "invalid command: " + command.status().message(), {}, {}});
      return;
    }
    log_->warn("event=command_dropped entry={} reason={}", daemon::LogValue(entry_id),
               daemon::LogQuoted(command.status().message()));
    reader_->Done(entry_id);  // acknowledged in Redis so it is not delivered again
    return;
  }
  const protocol::Command& c = command.value();
  log_->info("event=command entry={} id={} type={}", daemon::LogValue(entry_id), daemon::LogValue(c.id),
             daemon::LogValue(c.type));
  const std::vector<RankFollower*> followers = Followers();
  executor_->Execute(entry_id, c, followers, RealNowNs(), Clock::now());
  WatchCommands();
}

void Agent::OnPlanInForce(const std::string& text) {
  Result<protocol::Command> c = PlanInForceCommand(text);
  if (!c.ok()) {
    if (c.status().code() == Status::Code::kNotFound) {
      log_->info("event=plan_in_force_skipped reason={}", daemon::LogQuoted(c.status().message()));
    } else {
      ++invalid_messages_;
      log_->warn("event=plan_in_force_dropped reason={}", daemon::LogQuoted(c.status().message()));
    }
    return;
  }
  const std::vector<RankFollower*> followers = Followers();
  const CommandOutcome o = executor_->AdoptPlanInForce(c.value(), followers, RealNowNs());
  log_->info("event=plan_in_force version={} strategy={} status={} detail={}", c.value().plan_version,
             daemon::LogValue(c.value().strategy), daemon::LogValue(o.status), daemon::LogQuoted(o.detail));
}

void Agent::OnAck(const std::string& entry_id, const protocol::Command& c, const CommandOutcome& o) {
  ++commands_[o.status];
  protocol::Ack a;
  a.header = Header();
  if (c.type == protocol::kSetMode.type && config_.profile_ms > 0 && !o.ranks.empty()) {
    // The ranks that applied the mode start a window at the ack's own time, so a controller
    // that takes profiles from its ack on gets the first full window after the switch.
    const auto now = Clock::now();
    for (auto& [path, f] : followers_) {
      if (std::find(o.ranks.begin(), o.ranks.end(), f.follower->rank()) != o.ranks.end()) {
        CloseProfileWindow(f, a.header.at_ns, now);
      }
    }
  }
  a.command = c.id;
  a.command_type = c.type;
  a.status = o.status;
  a.detail = o.detail.substr(0, static_cast<std::size_t>(protocol::kMaxText));
  a.ranks = o.ranks;
  a.results = o.results;
  publisher_->Queue(Key(protocol::kAcksStream), protocol::ToJson(a));
  publisher_->FlushSoon();  // the controller waits on it, often with the job paused
  reader_->Done(entry_id);
  log_->info("event=ack id={} type={} status={} ranks={} detail={}", daemon::LogValue(c.id),
             daemon::LogValue(c.type), daemon::LogValue(o.status), o.ranks.size(), daemon::LogQuoted(o.detail));
}

void Agent::TrackPlans() {
  bool changed = false;
  const std::vector<RankFollower*> followers = Followers();
  executor_->CatchUpPlans(followers, RealNowNs(), [this](const RankFollower& f, std::uint32_t version) {
    log_->info("event=plan_delivered pid={} rank={} version={} late=1", f.pid(), f.rank(), version);
  });
  for (auto& [path, f] : followers_) {
    const std::uint32_t version = f.follower->plan_version();
    const daemon::PlanAcks acks = f.follower->plan_acks();
    const bool costs_changed = !std::equal(std::begin(acks.cost_s), std::end(acks.cost_s), f.costs_registered.begin());
    if (version == f.plan_registered && acks.count == f.acks_registered && !costs_changed) continue;
    if (acks.count != f.acks_registered && acks.last_version != 0) {
      log_->info("event=plan_ack pid={} rank={} version={} status={} applied={} rejected={}", f.follower->pid(),
                 f.follower->rank(), acks.last_version, acks.last_status, acks.applied, acks.rejected);
    }
    if (costs_changed) {
      log_->info("event=plan_cost pid={} rank={} s2={} s3={} s4={} pipeline={}", f.follower->pid(),
                 f.follower->rank(), acks.cost_s[0], acks.cost_s[1], acks.cost_s[2], acks.cost_s[3]);
    }
    f.plan_registered = version;
    f.acks_registered = acks.count;
    std::copy(std::begin(acks.cost_s), std::end(acks.cost_s), f.costs_registered.begin());
    changed = true;
  }
  // At once, not at the next heartbeat: the controller reads a rank key again when its beat in
  // the agent key names a new content, and it waits on these acks.
  if (changed) Heartbeat();
}

void Agent::QueueSignatures() {
  for (auto& [path, f] : followers_) QueueSignatures(*f.follower);
}

void Agent::QueueSignatures(RankFollower& r) {
  if (config_.signature_ms <= 0 || !r.has_signatures()) return;
  protocol::CallSignatures m;
  m.header = Header();
  m.rank = r.rank();
  m.pid = r.pid();
  TakenSignatures taken = r.TakeSignatures();
  if (taken.empty()) return;  // nothing complete: a busy communicator's held calls stay held
  m.comms = std::move(taken.comms);
  m.digests = std::move(taken.digests);
  if (taken.dropped > 0) m.dropped = taken.dropped;
  publisher_->Queue(Key(protocol::kSignaturesStream), protocol::Dump(m), /*packable=*/true);
  publisher_->FlushSoon();  // a mismatch is news: it may be the last call before a hang
  ++signature_messages_;
}

void Agent::CheckStalls() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const std::int64_t now_mono = static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  for (auto& [path, f] : followers_) {
    RankFollower& r = *f.follower;
    const double baseline = r.analysis().baseline_seconds();
    const double iteration_s = baseline > 0 ? baseline : f.last_seconds;
    // Only the last call's window is needed to name what the rank waits in.
    const daemon::SegmentProgress p = r.Progress(now_mono, 4);
    if (const std::optional<StallEvent> e = f.stall.Update(p, now_mono, iteration_s)) QueueStall(r, *e);
  }
}

void Agent::QueueStall(const RankFollower& r, const StallEvent& e) {
  ++(e.stalled ? stalls_ : stalls_ended_);
  protocol::StallReport m;
  m.header = Header();
  m.rank = r.rank();
  m.pid = r.pid();
  m.kind = e.stalled ? "stalled" : "progressing";
  m.age_s = e.age_s;
  m.bound_s = e.bound_s;
  if (e.last_call_mono_ns > 0) m.last_call_ns = std::max<std::int64_t>(0, e.last_call_mono_ns + r.real_minus_mono_ns());
  std::string where = "no known communicator";
  if (e.stalled) {
    if (e.waiting_in.comm != 0) {
      m.comm = protocol::CommIdHex(e.waiting_in.comm);
      where = "communicator " + *m.comm;
    }
    if (e.waiting_in.seq) {
      m.seq = *e.waiting_in.seq;
      m.op = analyzer::CallOpName(e.waiting_in.op);
      where = m.op.value() + " #" + std::to_string(*m.seq) + " on " + where;
    }
    m.in_call = e.waiting_in.in_host_call;
  }
  publisher_->Queue(Key(protocol::kStallsStream), protocol::ToJson(m));
  publisher_->FlushSoon();
  if (e.stalled) {
    log_->warn("event=stall pid={} rank={} age_s={:.1f} bound_s={:.1f} comm={} seq={} op={} in_call={}", m.pid,
               m.rank, m.age_s, m.bound_s, m.comm.value_or("-"), m.seq ? std::to_string(*m.seq) : "-",
               m.op.value_or("-"), m.in_call.value_or(false));
  } else {
    log_->info("event=stall_ended pid={} rank={} age_s={:.1f}", m.pid, m.rank, m.age_s);
  }
  protocol::Alert alert;
  alert.job = config_.job;
  alert.at_ns = m.header.at_ns;
  alert.severity = e.stalled ? "critical" : "info";
  alert.source = "agent";
  char summary[320];
  if (e.stalled) {
    std::snprintf(summary, sizeof summary,
                  "rank %lld on %s stalled: no NCCL call for %.1f s (bound %.1f s), waiting in %s %s",
                  static_cast<long long>(m.rank), env_.host.c_str(), m.age_s, m.bound_s, where.c_str(),
                  m.in_call.value_or(false) ? "(host call not returned)" : "(device work pending)");
  } else {
    std::snprintf(summary, sizeof summary, "rank %lld on %s makes progress again", static_cast<long long>(m.rank),
                  env_.host.c_str());
  }
  alert.summary = summary;
  alert.host = env_.host;
  alert.rank = m.rank;
  publisher_->Publish(Key(protocol::kAlertsChannel), protocol::ToJson(alert));
}

}  // namespace falcon::agent
