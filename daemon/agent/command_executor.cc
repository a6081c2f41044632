// CommandExecutor. See command_executor.h for the contract.
#include "daemon/agent/command_executor.h"

#include <time.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "daemon/agent/plan_delivery.h"
#include "daemon/protocol/validate.h"
#include "daemon/shm/progress_json.h"

namespace falcon::agent {
namespace {

CommandOutcome NotYet(const protocol::Command& c) {
  return {"unsupported",
          "'" + c.type + "' needs the shim's trap / benchmark executor, which this build lacks",
          {}, {}};
}

std::string RankList(const std::vector<std::int64_t>& ranks) {
  std::string s;
  for (std::int64_t r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

}  // namespace

void UnsupportedTrap::Pause(const protocol::Command& c, std::span<RankFollower* const>, Done done) {
  done(NotYet(c));
}
void UnsupportedTrap::Resume(const protocol::Command& c, std::span<RankFollower* const>, Done done) {
  done(NotYet(c));
}
void UnsupportedTrap::Validate(const protocol::Command& c, std::span<RankFollower* const>, Done done) {
  done(NotYet(c));
}

CommandExecutor::CommandExecutor(std::unique_ptr<TrapController> trap,
                                 std::chrono::milliseconds mode_timeout, AckFn ack)
    : trap_(std::move(trap)),
      plans_(std::make_unique<PlanDelivery>()),
      mode_timeout_(mode_timeout),
      ack_(std::move(ack)) {}

CommandExecutor::~CommandExecutor() = default;

std::size_t CommandExecutor::CatchUpPlans(
    std::span<RankFollower* const> followers, std::int64_t now_real_ns,
    const std::function<void(const RankFollower&, std::uint32_t)>& on_delivered) {
  if (plans_->newest() == 0) return 0;
  std::size_t n = 0;
  for (RankFollower* f : followers) {
    const std::uint32_t v = plans_->CatchUp(*f, now_real_ns);
    if (v == 0) continue;
    ++n;
    if (on_delivered) on_delivered(*f, v);
  }
  return n;
}

void CommandExecutor::Execute(const std::string& entry_id, const protocol::Command& c,
                              std::span<RankFollower* const> followers, std::int64_t now_real_ns,
                              Clock::time_point now) {
  if (c.deadline_ns && *c.deadline_ns < now_real_ns) {
    ack_(entry_id, c, {"expired", "deadline passed before the agent read it", {}, {}});
    return;
  }
  std::vector<RankFollower*> targets;
  for (RankFollower* f : followers) {
    if (!c.ranks || std::find(c.ranks->begin(), c.ranks->end(), f->rank()) != c.ranks->end()) {
      targets.push_back(f);
    }
  }
  if (c.type == protocol::kPlanCommand.type) {  // held for later ranks even with no target now
    ack_(entry_id, c, plans_->Execute(c, targets, now_real_ns));
    return;
  }
  if (targets.empty()) {
    ack_(entry_id, c, {"rejected",
                       c.ranks ? "none of ranks [" + RankList(*c.ranks) + "] runs on this host"
                               : "this agent follows no rank",
                       {}, {}});
    return;
  }
  // The trap outlives its Done callbacks (both are owned here), so `this` stays valid.
  TrapController::Done done = [this, entry_id, c](const CommandOutcome& o) { ack_(entry_id, c, o); };
  if (c.type == protocol::kPause.type) {
    trap_->Pause(c, targets, std::move(done));
  } else if (c.type == protocol::kResume.type) {
    trap_->Resume(c, targets, std::move(done));
  } else if (c.type == protocol::kValidate.type) {
    trap_->Validate(c, targets, std::move(done));
  } else if (c.type == protocol::kCutInfo.type) {
    ack_(entry_id, c, CutInfo(targets));
  } else if (c.type == protocol::kProgressCommand.type) {
    ack_(entry_id, c, ProgressOf(targets, c.calls.value_or(16)));
  } else if (c.type == protocol::kSetMode.type) {
    const auto mode = ModeFromName(c.mode);
    if (!mode) {
      ack_(entry_id, c, {"rejected", "unknown mode " + c.mode, {}, {}});
      return;
    }
    PendingMode p{entry_id, c, {}, now + mode_timeout_};
    for (RankFollower* f : targets) p.waits.push_back({f, f->rank(), f->RequestMode(*mode, c.sample_every)});
    pending_.push_back(std::move(p));
    Check(now);
  } else {
    ack_(entry_id, c, {"rejected", "unknown command type " + c.type, {}, {}});
  }
}

CommandOutcome CommandExecutor::CutInfo(std::span<RankFollower* const> targets) {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const std::int64_t mono_now = static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  CommandOutcome out{"ok", "", {}, {}};
  for (RankFollower* f : targets) {
    out.ranks.push_back(f->rank());
    protocol::AckRankResult r{f->rank(), "ok", {}, {}, {}, {}, {}, {}, {}, {}, {}};
    const Result<CallPatternReport> p = f->CutPattern();
    if (!p.ok()) {
      r.state = "unavailable";
      out.status = "failed";
      out.detail += (out.detail.empty() ? "" : "; ") + ("rank " + std::to_string(f->rank()) + ": " + p.status().message());
    } else {
      protocol::CutPatternMessage m{p.value().pattern, p.value().position, p.value().units_per_s,
                                    std::max(0.0, static_cast<double>(mono_now - p.value().last_call_ns) / 1e9)};
      m.pattern.rank = f->rank();
      r.pattern = protocol::CutPatternToJson(m);
    }
    out.results.push_back(std::move(r));
  }
  return out;
}

CommandOutcome CommandExecutor::ProgressOf(std::span<RankFollower* const> targets, std::int64_t calls) {
  // The ack must stay a valid message (protocol::kMaxMessageBytes, 1 MiB): many ranks, many
  // communicators and a long `calls` would not fit. Halve the calls per communicator until the
  // ranks' progress fits in 3/4 of it, and say so; the counters per communicator always go.
  constexpr std::size_t kBudget = protocol::kMaxMessageBytes / 4 * 3;
  const std::int64_t asked = calls;
  for (;;) {
    CommandOutcome out = ProgressOnce(targets, calls);
    std::size_t bytes = 0;
    for (const protocol::AckRankResult& r : out.results) bytes += r.progress ? r.progress->dump().size() : 0;
    if (bytes <= kBudget || calls == 0) {
      if (calls < asked) {
        out.detail = "latest calls per communicator cut from " + std::to_string(asked) + " to " + std::to_string(calls) +
                     " to fit the ack";
      }
      return out;
    }
    calls /= 2;
  }
}

CommandOutcome CommandExecutor::ProgressOnce(std::span<RankFollower* const> targets, std::int64_t calls) {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const std::int64_t mono_now = static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  CommandOutcome out{"ok", "", {}, {}};
  for (RankFollower* f : targets) {
    out.ranks.push_back(f->rank());
    const daemon::SegmentProgress p = f->Progress(mono_now, static_cast<std::size_t>(calls));
    protocol::AckRankResult r{f->rank(), p.paused ? "paused" : "ok", {}, {}, {}, {}, {}, {}, {}, {}, {}};
    analyzer::RankProgress rank = p.progress;
    if (rank.rank < 0) rank.rank = f->rank();
    nlohmann::json doc = daemon::ProgressToJson(std::span<const analyzer::RankProgress>(&rank, 1), "shm");
    nlohmann::json one = std::move(doc["ranks"][0]);
    // Beside the document's keys (readers ignore unknown ones): what tells a hang from a pause.
    one["paused"] = p.paused;
    one["phase"] = p.phase;
    one["quiet_s"] = p.last_call_mono_ns > 0 ? std::max(0.0, static_cast<double>(mono_now - p.last_call_mono_ns) / 1e9)
                                             : -1.0;
    r.progress = std::move(one);
    out.results.push_back(std::move(r));
  }
  return out;
}

CommandOutcome CommandExecutor::AdoptPlanInForce(const protocol::Command& plan,
                                                 std::span<RankFollower* const> followers,
                                                 std::int64_t now_real_ns) {
  return plans_->Execute(plan, followers, now_real_ns);
}

void CommandExecutor::Check(Clock::time_point now) {
  trap_->Check(std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count());
  for (auto it = pending_.begin(); it != pending_.end();) {
    CommandOutcome out;
    std::vector<std::int64_t> missing;
    for (const Wait& w : it->waits) {
      if (w.follower != nullptr && w.follower->ModeApplied(w.seq)) {
        out.ranks.push_back(w.rank);
      } else {
        missing.push_back(w.rank);
      }
    }
    if (!missing.empty() && now < it->deadline) {
      ++it;
      continue;
    }
    if (missing.empty()) {
      out.status = "ok";
    } else {
      out.status = "failed";
      out.detail = "not applied by rank(s) " + RankList(missing) +
                   " in time (process exited, read-only segment or shim not polling)";
    }
    ack_(it->entry_id, it->command, out);
    it = pending_.erase(it);
  }
}

void CommandExecutor::Forget(const RankFollower* follower) {
  trap_->Forget(follower);
  for (PendingMode& p : pending_) {
    for (Wait& w : p.waits) {
      if (w.follower == follower) w.follower = nullptr;
    }
  }
}

}  // namespace falcon::agent
