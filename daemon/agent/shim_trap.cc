// ShimTrap. See shim_trap.h for the contract.
#include "daemon/agent/shim_trap.h"

#include <algorithm>
#include <array>
#include <optional>

namespace falcon::agent {
namespace {

std::int64_t RealNow() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* PauseStateName(std::uint32_t s) {
  switch (s) {
    case kFalconPauseIdle: return "idle";
    case kFalconPauseArmed: return "armed";
    case kFalconPauseTrapped: return "trapped";
    case kFalconPauseMissed: return "missed";
    case kFalconPauseExpired: return "expired";
    case kFalconPauseTimedOut: return "timed_out";
    case kFalconPauseResumed: return "resumed";
    case kFalconPauseRejected: return "rejected";
    default: return "unknown";
  }
}

const char* TaskStatusName(std::int32_t s) {
  switch (s) {
    case kFalconTaskOk: return "ok";
    case kFalconTaskBadRequest: return "bad_request";
    case kFalconTaskUnsupported: return "unsupported";
    default: return "failed";
  }
}

// The live entry of communicator `id` in the rank's table.
std::optional<daemon::CommInfo> FindComm(const daemon::SegmentReader& seg, std::uint64_t id) {
  for (const daemon::CommInfo& c : seg.Comms()) {
    if (c.entry.comm_id == id && c.entry.state == kFalconCommLive) return c;
  }
  return std::nullopt;
}

CommandOutcome Rejected(std::string why) { return {"rejected", std::move(why), {}, {}}; }

std::string Hex(const std::uint8_t* p, std::size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

// REQUIRES: `hex` is 2 * FALCON_TASK_BLOB_LEN lower-case hex digits (ParseCommand checked).
std::array<std::uint8_t, FALCON_TASK_BLOB_LEN> Unhex(const std::string& hex) {
  std::array<std::uint8_t, FALCON_TASK_BLOB_LEN> out{};
  auto nibble = [](char c) { return static_cast<std::uint8_t>(c <= '9' ? c - '0' : c - 'a' + 10); };
  for (std::size_t i = 0; i < out.size() && 2 * i + 1 < hex.size(); ++i) {
    out[i] = static_cast<std::uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  }
  return out;
}

}  // namespace

// The task one rank runs for `c`, or a reason it cannot.
std::optional<ShimTrap::Task> ShimTrap::MakeTask(const protocol::Command& c, RankFollower& f, std::string* why) const {
  Task out;
  FalconTask& t = out.task;
  t.repeats = static_cast<std::uint32_t>(c.repeats.value_or(5));
  t.send_peer = t.recv_peer = -1;
  if (c.deadline_ns) {
    // The shim gives up a little before the command's deadline, so that its failure (and the
    // validation communicator's abort) is what the controller hears, not a missing ack.
    const std::int64_t now = RealNow(), left = *c.deadline_ns - now;
    t.deadline_real_ns = left > 0 ? *c.deadline_ns - std::min<std::int64_t>(1'000'000'000, left / 4) : now;
  }
  if (c.task == "gemm") {
    const std::int64_t n = c.size.value_or(256);
    if (n > 8192) {
      *why = "gemm size above 8192";
      return std::nullopt;
    }
    t.kind = kFalconTaskGemm;
    t.m = t.n = t.k = static_cast<std::uint32_t>(n);
    const std::string dtype = c.dtype.value_or("fp32");  // one of the protocol's enum (validated)
    t.dtype = dtype == "bf16" ? kFalconGemmBf16 : dtype == "fp16" ? kFalconGemmF16 : kFalconGemmF32;
    return out;
  }
  if (c.task == "vcomm_id") {
    t.kind = kFalconTaskCommId;
    t.repeats = 1;
    return out;
  }
  if (c.task == "vcomm_join") {
    const std::optional<std::int64_t> vrank = protocol::VrankOf(c, f.rank());
    if (!c.blob || !c.vranks || !vrank || !c.bytes) {
      *why = "vcomm_join needs blob, vranks, vrank (or vrank_each) and bytes";
      return std::nullopt;
    }
    if (*c.bytes > (std::int64_t{1} << 30)) {
      *why = "vcomm_join bytes above 1 GiB";
      return std::nullopt;
    }
    t.kind = kFalconTaskCommJoin;
    t.repeats = 1;
    t.m = static_cast<std::uint32_t>(*c.vranks);
    t.n = static_cast<std::uint32_t>(*vrank);
    t.bytes = static_cast<std::uint64_t>(*c.bytes);
    out.blob = Unhex(*c.blob);
    return out;
  }
  const std::optional<std::int64_t> peer = protocol::PeerOf(c, f.rank());
  if (!c.bytes || peer.has_value() == c.shift.has_value()) {
    *why = "p2p needs bytes and exactly one of peer / peers / shift";
    return std::nullopt;
  }
  if (*c.bytes > (std::int64_t{1} << 30)) {
    *why = "p2p bytes above 1 GiB";
    return std::nullopt;
  }
  // Validation traffic runs on the validation communicator, never on the job's (shm_abi.h).
  const auto joined = vcomm_.find(&f);
  if (joined == vcomm_.end()) {
    *why = "rank " + std::to_string(f.rank()) + " has not joined a validation communicator (vcomm_join)";
    return std::nullopt;
  }
  const std::int64_t me = joined->second.vrank, n = joined->second.vranks;
  t.kind = kFalconTaskP2p;
  t.comm_slot = FALCON_VALIDATION_COMM;
  t.bytes = static_cast<std::uint64_t>(*c.bytes);
  if (peer) {
    if (*peer >= n || *peer == me) {
      *why = "rank " + std::to_string(f.rank()) + ": peer " + std::to_string(*peer) +
             " is not another rank of the validation communicator";
      return std::nullopt;
    }
    t.send_peer = t.recv_peer = static_cast<std::int32_t>(*peer);
  } else {
    if (*c.shift % n == 0) {
      *why = "shift is a multiple of the validation communicator's size";
      return std::nullopt;
    }
    t.send_peer = static_cast<std::int32_t>((me + *c.shift) % n);
    t.recv_peer = static_cast<std::int32_t>(((me - *c.shift) % n + n) % n);
  }
  return out;
}

namespace {
}  // namespace

std::int64_t ShimTrap::WaitDeadline(const protocol::Command& c, std::int64_t now) const {
  return c.deadline_ns ? *c.deadline_ns
                       : now + std::chrono::duration_cast<std::chrono::nanoseconds>(options_.wait).count();
}

std::uint64_t ShimTrap::ActivePause(RankFollower* f, bool trapped_only) const {
  const auto it = paused_.find(f);
  if (it == paused_.end()) return 0;
  std::uint64_t ack = 0;
  const FalconPauseState s = f->segment().pause_state(&ack);
  if (ack != it->second) return trapped_only ? 0 : it->second;  // not seen by the shim yet
  if (s == kFalconPauseTrapped || (!trapped_only && s == kFalconPauseArmed)) return it->second;
  return 0;
}

void ShimTrap::Pause(const protocol::Command& c, std::span<RankFollower* const> targets, Done done) {
  if (c.targets.empty() && (!c.comm || !c.comm_seq)) {
    return done(Rejected("pause needs targets (a consistent cut per rank), or comm and comm_seq: the shim "
                         "stops every rank before the same call of one communicator"));
  }
  std::vector<std::vector<FalconPauseTarget>> cuts;
  std::vector<std::vector<std::pair<std::uint32_t, std::uint64_t>>> expects;
  for (RankFollower* f : targets) {  // check every rank before arming any
    const std::string who = "rank " + std::to_string(f->rank());
    if (!f->writable()) return done(Rejected(who + ": read-only segment"));
    if (ActivePause(f, false) != 0) return done(Rejected(who + " is already paused or armed"));
    std::vector<FalconPauseTarget> cut;
    std::vector<std::pair<std::uint32_t, std::uint64_t>> expect;
    if (c.targets.empty()) {
      const auto comm = FindComm(f->segment(), *protocol::ParseCommIdHex(*c.comm));
      if (!comm) return done(Rejected(who + " is not in communicator " + *c.comm));
      cut.push_back({comm->slot, 0, *c.comm_seq});
    } else {
      const auto mine = std::find_if(c.targets.begin(), c.targets.end(),
                                     [&](const protocol::Command::RankTargets& t) { return t.rank == f->rank(); });
      if (mine == c.targets.end()) return done(Rejected(who + " has no targets in the cut"));
      for (const analyzer::CutTarget& t : mine->targets) {
        const auto comm = FindComm(f->segment(), t.comm);
        if (!comm) return done(Rejected(who + " is not in communicator " + protocol::CommIdHex(t.comm)));
        cut.push_back({comm->slot, 0, t.trigger_seq});
        expect.emplace_back(comm->slot, t.expect_seq);
      }
    }
    cuts.push_back(std::move(cut));
    expects.push_back(std::move(expect));
  }
  const std::int64_t now = RealNow();
  const std::int64_t shim_deadline = now + static_cast<std::int64_t>(c.max_pause_s * 1e9);
  Pending p{Kind::kPause, {}, shim_deadline + kGraceNs, std::move(done)};
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const std::uint64_t gen = targets[i]->segment().RequestPause(cuts[i], shim_deadline);
    paused_[targets[i]] = gen;
    p.ranks.push_back({targets[i], targets[i]->rank(), gen, {targets[i]->rank(), "requested", {}, {}, {}, {}, {}, {}, {}, {}, {}},
                       false, std::move(expects[i])});
  }
  pending_.push_back(std::move(p));
  Check(now);
}

void ShimTrap::Resume(const protocol::Command& c, std::span<RankFollower* const> targets, Done done) {
  const std::int64_t now = RealNow();
  Pending p{Kind::kResume, {}, WaitDeadline(c, now), std::move(done)};
  for (RankFollower* f : targets) {
    const std::uint64_t gen = ActivePause(f, false);
    if (gen == 0) continue;
    f->segment().RequestResume(gen);
    p.ranks.push_back({f, f->rank(), gen, {f->rank(), "resuming", {}, {}, {}, {}, {}, {}, {}, {}, {}}, false, {}});
  }
  if (p.ranks.empty()) return p.done(Rejected("no rank here is paused by this agent"));
  pending_.push_back(std::move(p));
  Check(now);
}

void ShimTrap::Validate(const protocol::Command& c, std::span<RankFollower* const> all, Done done) {
  // Without `ranks` (a command for every agent): the ranks this agent holds trapped; a rank it
  // follows but did not pause (one that joined after the cut) is not the command's.
  std::vector<RankFollower*> trapped;
  if (!c.ranks) {
    for (RankFollower* f : all) {
      if (ActivePause(f, true) != 0) trapped.push_back(f);
    }
    if (trapped.empty()) return done(Rejected("no rank here is trapped by this agent"));
  }
  const std::span<RankFollower* const> targets = c.ranks ? all : std::span<RankFollower* const>(trapped);
  std::vector<Task> tasks;
  for (RankFollower* f : targets) {  // check every rank before posting any task
    if (ActivePause(f, true) == 0) {
      return done(Rejected("rank " + std::to_string(f->rank()) + " is not trapped by this agent"));
    }
    std::string why;
    const auto task = MakeTask(c, *f, &why);
    if (!task) return done(Rejected(why));
    tasks.push_back(*task);
  }
  const std::int64_t now = RealNow();
  Pending p{Kind::kValidate, {}, WaitDeadline(c, now), std::move(done)};
  for (std::size_t i = 0; i < targets.size(); ++i) {
    daemon::SegmentReader& seg = targets[i]->segment();
    if (tasks[i].task.kind == kFalconTaskCommJoin) {
      vcomm_[targets[i]] = {static_cast<std::int64_t>(tasks[i].task.n), static_cast<std::int64_t>(tasks[i].task.m)};
    }
    const std::uint64_t seq = tasks[i].blob ? seg.PostTask(tasks[i].task, tasks[i].blob->data()) : seg.PostTask(tasks[i].task);
    p.ranks.push_back({targets[i], targets[i]->rank(), seq, {targets[i]->rank(), "running", {}, {}, {}, {}, {}, {}, {}, {}, {}}, false, {}});
  }
  pending_.push_back(std::move(p));
  Check(now);
}

void ShimTrap::Poll(Pending& p, RankWait& w) {
  if (w.follower == nullptr) {
    w.result.state = "exited";
    w.done = true;
    return;
  }
  daemon::SegmentReader& seg = w.follower->segment();
  if (p.kind == Kind::kValidate) {
    FalconTaskResult r{};
    if (!seg.TaskDone(w.seq, &r)) return;
    w.result.state = "done";
    w.result.task_status = TaskStatusName(r.status);
    w.result.median_s = r.median_s;
    w.result.min_s = r.min_s;
    w.result.max_s = r.max_s;
    w.result.rate = r.rate;
    if (r.kind == kFalconTaskGemm) {
      static constexpr const char* kTypes[] = {"fp32", "bf16", "fp16"};
      if (r.dtype < 3) w.result.dtype = kTypes[r.dtype];
    }
    if (r.kind == kFalconTaskCommId && r.status == kFalconTaskOk) {
      std::uint8_t blob[FALCON_TASK_BLOB_LEN];
      seg.TaskResultBlob(blob);
      w.result.blob = Hex(blob, sizeof(blob));
    }
    w.done = true;
    return;
  }
  std::uint64_t ack = 0;
  const FalconPauseState s = seg.pause_state(&ack);
  if (ack != w.seq) return;  // the shim has not taken the request yet
  w.result.state = PauseStateName(s);
  if (p.kind == Kind::kPause && s == kFalconPauseTrapped) {
    // The cut must be the one planned. The call the rank is held before has its comm_seq taken
    // already (shm_abi.h, trapped_comm_slot): it is not issued.
    const std::uint32_t held = seg.trapped_comm_slot();
    for (const auto& [slot, calls] : w.expect) {
      if (seg.CommCalls(slot) - (slot == held ? 1 : 0) != calls) w.result.state = "misaligned";
    }
  }
  w.done = p.kind == Kind::kPause ? s != kFalconPauseArmed && s != kFalconPauseIdle
                                  : s != kFalconPauseTrapped && s != kFalconPauseArmed;
}

CommandOutcome ShimTrap::Finish(Pending& p) {
  CommandOutcome out{"ok", "", {}, {}};
  const char* want = p.kind == Kind::kPause ? "trapped" : p.kind == Kind::kResume ? "resumed" : "done";
  std::string bad;
  for (RankWait& w : p.ranks) {
    out.results.push_back(w.result);
    const bool good = w.done && w.result.state == want &&
                      (p.kind != Kind::kValidate || w.result.task_status == "ok");
    if (good) {
      out.ranks.push_back(w.rank);
      continue;
    }
    bad += (bad.empty() ? "" : ", ") + std::to_string(w.rank) + ": " + w.result.state +
           (w.result.task_status ? " " + *w.result.task_status : "") + (w.done ? "" : " (no answer)");
    if (out.status == "ok") out.status = "failed";
    if (p.kind == Kind::kPause && w.result.state == "expired") out.status = "expired";
    if (w.result.state == "rejected") out.status = "rejected";
  }
  if (out.status == "ok") return out;
  out.detail = "rank " + bad;
  if (p.kind == Kind::kPause) {  // no partial cut: release the ranks that did stop
    for (RankWait& w : p.ranks) {
      if (w.follower != nullptr) w.follower->segment().RequestResume(w.seq);
      paused_.erase(w.follower);
    }
    out.ranks.clear();
    out.detail += "; ranks that trapped were released";
  }
  if (p.kind == Kind::kResume) {
    for (RankWait& w : p.ranks) {
      paused_.erase(w.follower);
      vcomm_.erase(w.follower);  // the shim aborts its validation communicator when the pause ends
    }
  }
  return out;
}

void ShimTrap::Check(std::int64_t now_real_ns) {
  for (std::size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    bool all = true;
    for (RankWait& w : p.ranks) {
      if (!w.done) Poll(p, w);
      all = all && w.done;
    }
    if (!all && now_real_ns < p.deadline_real_ns) {
      ++i;
      continue;
    }
    if (p.kind == Kind::kResume && all) {
      for (RankWait& w : p.ranks) {
        paused_.erase(w.follower);
        vcomm_.erase(w.follower);
      }
    }
    Pending finished = std::move(p);
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    finished.done(Finish(finished));  // may not touch pending_ (Done only acks)
  }
}

void ShimTrap::Forget(const RankFollower* follower) {
  paused_.erase(follower);
  vcomm_.erase(follower);
  for (Pending& p : pending_) {
    for (RankWait& w : p.ranks) {
      if (w.follower == follower) w.follower = nullptr;
    }
  }
}

}  // namespace falcon::agent
