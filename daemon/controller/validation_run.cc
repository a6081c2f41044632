// ValidationRun: see validation_run.h.
#include "daemon/controller/validation_run.h"

#include "falcon/shm_abi.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>

namespace falcon::controller {
namespace {

using nlohmann::json;

// An ack's results by reference (json::value would copy them: at 16,384 ranks a cut_info
// step's acks carry megabytes of call patterns); empty when absent or not a list.
const json& AckResults(const json& ack) {
  static const json kNone = json::array();
  const auto it = ack.find("results");
  return it != ack.end() && it->is_array() ? *it : kNone;
}

constexpr std::int64_t kNsPerS = 1'000'000'000;
// Pass numbers of probe exchanges: apart from the planned passes' (each is a pass of its own).
constexpr std::uint32_t kProbePassBase = 1u << 24;

std::int64_t AfterSeconds(std::int64_t now_ns, double s) {
  return now_ns + static_cast<std::int64_t>(s * static_cast<double>(kNsPerS));
}

// Milliseconds from `from_ns` to `now_ns`, to the tenth (0 before the first send).
double MsSince(std::int64_t from_ns, std::int64_t now_ns) {
  return from_ns > 0 && now_ns > from_ns ? std::round(static_cast<double>(now_ns - from_ns) / 1e5) / 10 : 0.0;
}

// What went wrong on many hosts (or ranks), for a failure text: the first kListed entries are
// spelled out, the rest counted. A job of thousands of agents can fail a step on thousands of
// them at once, and the text ends in an incident's one-line summary and in the round's log.
class ProblemList {
 public:
  static constexpr std::size_t kListed = 8;
  // `unanswered`: the entry is a host that did not answer at all.
  void Add(std::string entry, bool unanswered = false) {
    if (shown_.size() < kListed) shown_.push_back(std::move(entry));
    ++count_;
    unanswered_ += unanswered ? 1 : 0;
  }
  // "a; b; " or, past kListed, "a; ...; h; and 12 more (15 of 20 agents did not answer); ".
  std::string Text(std::size_t agents) const {
    std::string out;
    for (const std::string& e : shown_) out += e + "; ";
    if (count_ > shown_.size()) {
      out += "and " + std::to_string(count_ - shown_.size()) + " more (" + std::to_string(unanswered_) + " of " +
             std::to_string(agents) + " agents did not answer); ";
    }
    return out;
  }

 private:
  std::vector<std::string> shown_;
  std::size_t count_ = 0;
  std::size_t unanswered_ = 0;
};

std::vector<std::size_t> Sequence(std::size_t n) {
  std::vector<std::size_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

// Adds `m` to `list`, or, when that exchange (that GEMM) was measured already, keeps the lower
// time. `at` indexes `list` by key: a lookup, not a scan — a sweep at 16,384 ranks measures
// hundreds of thousands of exchanges.
template <typename Measurement, typename Key>
void Merge(std::vector<Measurement>& list, std::map<Key, std::size_t>& at, const Key& key, const Measurement& m) {
  auto [it, fresh] = at.emplace(key, list.size());
  if (fresh) {
    list.push_back(m);
  } else {
    list[it->second].median_s = std::min(list[it->second].median_s, m.median_s);
  }
}

}  // namespace

std::string RemeasureReason(const analyzer::Localization& l, double marginal_ratio) {
  std::map<std::pair<std::int64_t, std::int64_t>, std::size_t> links;  // node pair -> slow measurements
  for (const analyzer::SlowLink& k : l.links) {
    // Links inside one node (NVLink, PCIe) are told apart by their rank pairs: two slow pairs on
    // one node are two culprits, not one node pair measured twice.
    const bool known = k.sender_node >= 0 && k.receiver_node >= 0 && k.sender_node != k.receiver_node;
    const std::int64_t a = known ? k.sender_node : k.sender, b = known ? k.receiver_node : k.receiver;
    // Rank pairs stand for themselves when a node is unknown or shared (offset off the node numbers).
    const std::int64_t offset = known ? 0 : std::int64_t{1} << 32;
    links[{std::min(a, b) + offset, std::max(a, b) + offset}] += std::max<std::size_t>(k.measurements, 1);
  }
  const std::size_t culprits = l.gpus.size() + links.size() + l.nics.size();
  if (culprits > 1) return std::to_string(culprits) + " culprits at once";
  for (const auto& [pair, measurements] : links) {
    // One slow transfer is what a preempted sender or receiver gives; a congested link slows
    // every exchange across it (both rank pairs of a TP-2 job, or both ring passes).
    if (measurements < 2) return "a slow link that rests on one slow measurement";
  }
  for (const analyzer::SlowNic& n : l.nics) {
    if (n.slow_peer_nodes < n.tested_peer_nodes) {
      return "NIC of node " + std::to_string(n.node) + " slow to " + std::to_string(n.slow_peer_nodes) + " of " +
             std::to_string(n.tested_peer_nodes) + " peer nodes";
    }
  }
  // A lone culprit just past the threshold is what one GEMM or transfer slowed by a busy host
  // gives (the healthy 10-minute end-to-end job: a GEMM at 1.25x); a fail-slow that matters
  // is 1.3x-10x and stays so when measured again.
  auto marginal = [&](const analyzer::Evidence& e) { return e.ratio < marginal_ratio; };
  for (const analyzer::SlowGpu& g : l.gpus) {
    if (marginal(g.evidence)) {
      return fmt::format("rank {}'s GEMM only {:.2f}x the median (< {:.2f}x)", g.rank, g.evidence.ratio, marginal_ratio);
    }
  }
  for (const analyzer::SlowLink& k : l.links) {
    if (marginal(k.evidence)) {
      return fmt::format("link {}->{} only {:.2f}x its baseline (< {:.2f}x)", k.sender, k.receiver, k.evidence.ratio,
                         marginal_ratio);
    }
  }
  for (const analyzer::SlowNic& n : l.nics) {
    if (marginal(n.evidence)) {
      return fmt::format("NIC of node {} only {:.2f}x its baseline (< {:.2f}x)", n.node, n.evidence.ratio,
                         marginal_ratio);
    }
  }
  return "";
}

ValidationRun::ValidationRun(std::string id, std::vector<ValidationStep> steps, ValidationSettings settings,
                             bool release_first)
    : id_(std::move(id)),
      steps_(std::move(steps)),
      settings_(settings),
      phase_(release_first ? Phase::kResume : Phase::kPause),
      lead_s_(settings.pause_lead_s),
      order_(Sequence(steps_.size())) {}

protocol::Command ValidationRun::NewCommand(const std::string& type, std::int64_t now_ns, double timeout_s) {
  protocol::Command c;
  c.type = type;
  c.id = id_ + "-" + std::to_string(++commands_);
  c.issued_ns = now_ns;
  c.deadline_ns = AfterSeconds(now_ns, timeout_s);
  return c;
}

bool ValidationRun::AllAcked() const {
  return std::all_of(pending_.begin(), pending_.end(), [](const auto& p) { return p.second.has_value(); });
}

void ValidationRun::OnAck(json ack) {
  auto it = pending_.find({ack["command"].get<std::string>(), ack["host"].get<std::string>()});
  if (it != pending_.end() && !it->second) it->second = std::move(ack);
}

void ValidationRun::NewStep() {
  if (!pending_.empty()) answered_.push_back(std::move(pending_));
  pending_.clear();
}

std::vector<OutgoingCommand> ValidationRun::Next(const JobView& view, std::int64_t now_ns) {
  for (;;) {
    const bool waiting = phase_ == Phase::kAwaitCutInfo || phase_ == Phase::kAwaitPause ||
                         phase_ == Phase::kAwaitStep || phase_ == Phase::kAwaitResume;
    if (waiting && !AllAcked() && now_ns < deadline_ns_) return {};
    switch (phase_) {
      case Phase::kPause:
        if (now_ns < cut_retry_ns_) return {};
        return SendCutInfo(view, now_ns);
      case Phase::kAwaitCutInfo: return SendPlannedPause(view, now_ns);
      case Phase::kAwaitPause: FinishPause(view, now_ns); break;
      case Phase::kStep: return SendStep(view, now_ns);
      case Phase::kAwaitStep: FinishStep(view, now_ns); break;
      case Phase::kResume: return SendResume(view, now_ns);
      case Phase::kAwaitResume:
        if (retry_pause_) {  // released after a missed cut: now try again further ahead
          retry_pause_ = false;
          phase_ = Phase::kPause;
          break;
        }
        resumed_ns_ = now_ns;
        if (!AllAcked()) {
          log_.push_back({{"step", "resume"}, {"note", "not every agent acked the resume"}, {"ms", MsSince(sent_ns_, now_ns)}});
        } else {
          log_.push_back({{"step", "resume"}, {"ms", MsSince(sent_ns_, now_ns)}});
        }
        phase_ = Phase::kDone;
        break;
      case Phase::kDone: return {};
    }
  }
}

std::string ValidationRun::NoCutReason(const JobView& view) const {
  std::size_t widest = 0;
  std::string missing;
  for (const auto& [id, c] : view.comms()) {
    // The widest communicator; among equally wide ones (DP groups), one with members missing.
    if (c.members.size() < widest || (c.members.size() == widest && !missing.empty())) continue;
    std::string gaps;
    for (std::size_t r = 0; r < c.members.size(); ++r) {
      if (c.members[r] < 0) gaps += (gaps.empty() ? "" : ", ") + std::to_string(r);
    }
    if (c.members.size() == widest && gaps.empty()) continue;
    widest = c.members.size();
    missing = std::move(gaps);
  }
  if (!missing.empty()) {  // the likeliest cause first: ranks nobody can pause
    return "members " + missing + " of the job's widest communicator (" + std::to_string(widest) +
           " ranks) have no live agent: they cannot be paused";
  }
  if (!cut_failure_.empty()) return "no consistent cut: " + cut_failure_;
  return "no communicator spans every live rank with a known call rate: nowhere to cut";
}

std::vector<OutgoingCommand> ValidationRun::SendCutInfo(const JobView& view, std::int64_t now_ns) {
  NewStep();
  if (view.agent_hosts().empty()) return SendPause(view, now_ns);  // says why there is no cut
  std::vector<OutgoingCommand> out = AwaitFromEveryAgent(view, std::string(protocol::kCutInfo.type), now_ns);
  cut_info_ns_ = now_ns;
  deadline_ns_ = AfterSeconds(now_ns, settings_.ack_timeout_s);
  phase_ = Phase::kAwaitCutInfo;
  return out;
}

std::vector<OutgoingCommand> ValidationRun::SendPlannedPause(const JobView& view, std::int64_t now_ns) {
  std::vector<analyzer::RankCallPattern> patterns;
  std::vector<double> pace;  // units per second, per pattern
  std::map<std::int64_t, std::string> host_of;
  ProblemList problems;  // what kept the cut from being planned
  for (const auto& [key, ack] : pending_) {
    if (!ack) {
      problems.Add(key.second + ": no answer", true);
      continue;
    }
    if ((*ack)["status"] != "ok") problems.Add(key.second + ": " + ack->value("detail", std::string("failed")));
    for (const json& r : AckResults(*ack)) {
      const auto pattern_json = r.find("pattern");
      if (pattern_json == r.end()) continue;
      auto m = protocol::ParseCutPattern(*pattern_json);
      if (!m.ok()) {
        problems.Add(key.second + ": " + m.status().message());
        continue;
      }
      analyzer::RankCallPattern pattern = std::move(m.value().pattern);  // moved: megabytes at 16,384 ranks
      // Where the rank will be once the pause reaches it: its position when reported, plus its
      // pace over the report's age, the time since we asked and the lead.
      const double ahead_s = m.value().age_s + static_cast<double>(now_ns - cut_info_ns_) / kNsPerS + lead_s_;
      pattern.min_position = m.value().position + static_cast<std::uint64_t>(std::ceil(m.value().units_per_s * ahead_s)) + 1;
      host_of[pattern.rank] = key.second;
      patterns.push_back(std::move(pattern));
      pace.push_back(m.value().units_per_s);
    }
  }
  const std::string why = problems.Text(pending_.size());
  analyzer::CutPlan plan;
  analyzer::CutOptions options;
  options.iteration_start_tries = static_cast<std::uint64_t>(std::max(settings_.cut_iteration_tries, 0));
  if (why.empty()) plan = analyzer::PlanCut(patterns, options);
  else plan.failure = why;
  if (!plan.ok()) {
    if (plan.failure != cut_failure_) {
      log_.push_back({{"step", "cut"}, {"attempt", pause_attempt_ + 1}, {"failed", plan.failure}});
    }
    cut_failure_ = plan.failure;
    if (view.CutComm()) return SendPause(view, now_ns);  // the one-communicator cut
    // No pattern yet (a fresh job locks its period after a few iterations): ask again shortly.
    if (cut_wait_deadline_ns_ == 0) cut_wait_deadline_ns_ = AfterSeconds(now_ns, settings_.ack_timeout_s);
    NewStep();
    if (now_ns < cut_wait_deadline_ns_) {
      cut_retry_ns_ = AfterSeconds(now_ns, 0.5);
      phase_ = Phase::kPause;
      return {};
    }
    failure_ = NoCutReason(view);
    phase_ = Phase::kDone;
    return {};
  }
  NewStep();
  std::map<std::string, std::vector<protocol::Command::RankTargets>> by_host;
  for (analyzer::RankCut& c : plan.ranks) by_host[host_of[c.rank]].push_back({c.rank, std::move(c.targets)});
  std::vector<OutgoingCommand> out;
  for (auto& [host, targets] : by_host) {
    protocol::Command cmd = NewCommand("pause", now_ns, settings_.max_pause_s);
    cmd.max_pause_s = settings_.max_pause_s;
    cmd.targets = std::move(targets);
    pending_[{cmd.id, host}] = std::nullopt;
    out.push_back({host, std::move(cmd)});
  }
  log_.push_back({{"step", "pause"}, {"attempt", pause_attempt_ + 1}, {"cut", "planned"},
                  {"ranks", plan.ranks.size()}, {"lead_s", lead_s_}});
  // The longest any rank needs to reach its stop at its pace (the lead, unless the cut had to
  // go further to be consistent).
  double slowest = lead_s_;
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    if (pace[i] <= 0) continue;
    const double extra = static_cast<double>(plan.ranks[i].position - patterns[i].min_position) / pace[i];
    slowest = std::max(slowest, lead_s_ + extra);
  }
  deadline_ns_ = AfterSeconds(now_ns, slowest + settings_.ack_timeout_s);
  sent_ns_ = now_ns;
  phase_ = Phase::kAwaitPause;
  return out;
}

std::vector<OutgoingCommand> ValidationRun::SendPause(const JobView& view, std::int64_t now_ns) {
  NewStep();
  const std::optional<std::uint64_t> cut = view.CutComm();
  if (!cut && cut_wait_deadline_ns_ == 0) cut_wait_deadline_ns_ = AfterSeconds(now_ns, settings_.ack_timeout_s);
  if (!cut && !view.agent_hosts().empty() && now_ns < cut_wait_deadline_ns_) {
    return {};  // a fresh view has no call rates yet (two reports make one): wait for the next
  }
  if (!cut || view.agent_hosts().empty()) {
    failure_ = NoCutReason(view);
    phase_ = Phase::kDone;
    return {};
  }
  const CommInfo& c = view.comms().at(*cut);
  const double stale_s = std::max<double>(0, static_cast<double>(now_ns - c.max_calls_at_ns) / kNsPerS);
  const auto ahead = static_cast<std::uint64_t>(std::ceil(c.calls_per_s * (stale_s + lead_s_))) + 1;
  std::vector<OutgoingCommand> out;
  for (const std::string& host : view.agent_hosts()) {
    protocol::Command cmd = NewCommand("pause", now_ns, settings_.max_pause_s);
    cmd.max_pause_s = settings_.max_pause_s;
    cmd.comm = protocol::CommIdHex(*cut);
    cmd.comm_seq = c.max_calls + ahead;
    pending_[{cmd.id, host}] = std::nullopt;
    out.push_back({host, std::move(cmd)});
  }
  log_.push_back({{"step", "pause"}, {"attempt", pause_attempt_ + 1}, {"comm", protocol::CommIdHex(*cut)},
                  {"comm_seq", c.max_calls + ahead}, {"lead_s", lead_s_}});
  deadline_ns_ = AfterSeconds(now_ns, stale_s + lead_s_ + settings_.ack_timeout_s);
  sent_ns_ = now_ns;
  phase_ = Phase::kAwaitPause;
  return out;
}

void ValidationRun::FinishPause(const JobView& view, std::int64_t now_ns) {
  (void)view;
  bool ok = true, missed = false;
  ProblemList problems;
  for (const auto& [key, ack] : pending_) {
    if (!ack) {
      ok = false;
      problems.Add(key.second + ": no ack", true);
      continue;
    }
    if ((*ack)["status"] == "ok") continue;
    ok = false;
    problems.Add(key.second + ": " + (*ack)["status"].get<std::string>() + " " + ack->value("detail", ""));
    for (const json& r : AckResults(*ack)) {
      missed = missed || r.value("state", "") == "missed" || r.value("state", "") == "misaligned";
    }
  }
  if (ok) {
    paused_ = true;
    paused_ns_ = now_ns;
    log_.push_back({{"step", "paused"}, {"ms", MsSince(sent_ns_, now_ns)}});
    phase_ = steps_.empty() ? Phase::kResume : Phase::kStep;
    return;
  }
  const std::string why = problems.Text(pending_.size());
  ++pause_attempt_;
  log_.push_back({{"step", "pause"}, {"failed", why}});
  if (missed && pause_attempt_ < settings_.pause_attempts) {
    lead_s_ *= 2;  // some rank was already past the cut: aim further ahead (after releasing all)
  } else {
    failure_ = "pause failed: " + why;
  }
  phase_ = Phase::kResume;  // release whatever did stop before any retry
}

std::vector<OutgoingCommand> ToEveryAgent(const JobView& view, const std::function<protocol::Command()>& make,
                                          const std::function<void(const std::string&, const std::string&)>& await) {
  std::vector<OutgoingCommand> out;
  const bool one = view.Broadcast();
  for (const std::string& host : view.agent_hosts()) {
    if (!one || out.empty()) out.push_back({one ? "" : host, make()});
    await(out.back().command.id, host);
  }
  return out;
}

std::vector<OutgoingCommand> ValidationRun::AwaitFromEveryAgent(const JobView& view, const std::string& type,
                                                                std::int64_t now_ns) {
  return ToEveryAgent(
      view, [&] { return NewCommand(type, now_ns, settings_.ack_timeout_s); },
      [&](const std::string& id, const std::string& host) { pending_[{id, host}] = std::nullopt; });
}

void ValidationRun::SetGemm(protocol::Command& cmd) const {
  cmd.size = settings_.gemm_size;
  if (settings_.gemm_dtype != "fp32") cmd.dtype = settings_.gemm_dtype;  // absent: fp32, for older agents
  cmd.repeats = settings_.gemm_repeats;
}

bool ValidationRun::EveryLiveRank(const ValidationStep& step, const JobView& view) {
  // The step's ranks that are live (each has an agent: view.ranks() are the live ranks) are a
  // subset of view.ranks(): as many of them, distinct, means all of them.
  std::vector<std::int64_t> ranks;
  ranks.reserve(step.tasks.size());
  for (const RankTaskSpec& t : step.tasks) {
    if (t.task != "gemm") return false;
    if (view.AgentOf(t.rank) != nullptr) ranks.push_back(t.rank);
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return !ranks.empty() && ranks.size() == view.ranks().size();
}

std::vector<OutgoingCommand> ValidationRun::SendStep(const JobView& view, std::int64_t now_ns) {
  NewStep();
  const ValidationStep& step = steps_[order_[cursor_]];
  std::vector<OutgoingCommand> out;
  if (view.Broadcast() && EveryLiveRank(step, view)) {
    // A GEMM on every live rank carries nothing per host: one command on the broadcast stream
    // (each agent runs it on the ranks it holds paused), acked by every host.
    out = ToEveryAgent(
        view,
        [&] {
          protocol::Command cmd = NewCommand("validate", now_ns, settings_.ack_timeout_s);
          cmd.task = "gemm";
          SetGemm(cmd);
          return cmd;
        },
        [&](const std::string& id, const std::string& host) { pending_[{id, host}] = std::nullopt; });
  } else {
    out = StepPerHost(step, view, now_ns);
  }
  deadline_ns_ = AfterSeconds(now_ns, settings_.ack_timeout_s);
  sent_ns_ = now_ns;
  phase_ = Phase::kAwaitStep;
  return out;
}

std::vector<OutgoingCommand> ValidationRun::StepPerHost(const ValidationStep& step, const JobView& view,
                                                        std::int64_t now_ns) {
  // One command per host and task: a step of a sweep at 16,384 ranks is 2,048 commands, not
  // 16,384. A host's ranks each get their own peer (`peers`) or validation rank (`vrank_each`);
  // a host with one rank in the step gets the single-rank form (`peer`, `vrank`).
  std::map<std::pair<std::string, std::string>, std::vector<const RankTaskSpec*>> by_host;  // (host, task)
  for (const RankTaskSpec& t : step.tasks) {
    const std::string* host = view.AgentOf(t.rank);
    if (host == nullptr) continue;  // the rank is gone: its measurement is missing
    by_host[{*host, t.task}].push_back(&t);
  }
  std::vector<OutgoingCommand> out;
  for (const auto& [key, tasks] : by_host) {
    const auto& [host, task] = key;
    protocol::Command cmd = NewCommand("validate", now_ns, settings_.ack_timeout_s);
    cmd.task = task;
    std::vector<std::int64_t> ranks, each;
    for (const RankTaskSpec* t : tasks) {
      ranks.push_back(t->rank);
      each.push_back(task == "vcomm_join" ? t->vrank : t->peer);
    }
    const bool one = tasks.size() == 1;
    cmd.ranks = ranks;
    if (task == "gemm") {
      SetGemm(cmd);
    } else if (task == "vcomm_join") {
      cmd.blob = vcomm_blob_;
      cmd.vranks = tasks.front()->vranks;
      if (one) cmd.vrank = each.front(); else cmd.vrank_each = each;
      cmd.bytes = settings_.p2p_bytes;
    } else if (task == "p2p") {
      // The job's communicator is for the record; a probe measures none, and one command may
      // measure several (a DP pass: each of a host's ranks in another DP group).
      const std::uint64_t comm = tasks.front()->comm;
      const bool shared = std::all_of(tasks.begin(), tasks.end(), [&](const RankTaskSpec* t) { return t->comm == comm; });
      if (comm != 0 && shared) cmd.comm = protocol::CommIdHex(comm);
      if (one) cmd.peer = each.front(); else cmd.peers = each;
      cmd.bytes = settings_.p2p_bytes;
      cmd.repeats = settings_.p2p_repeats;
    }
    pending_[{cmd.id, host}] = std::nullopt;
    out.push_back({host, std::move(cmd)});
  }
  return out;
}

// The validation communicator's steps: its id must come back, and every rank must join, or
// no transfer is posted (the P2P part of the round ends here; GEMM results stand).
bool ValidationRun::FinishVcommStep(const ValidationStep& step, std::int64_t now_ns) {
  if (step.tasks.empty() || (step.tasks.front().task != "vcomm_id" && step.tasks.front().task != "vcomm_join")) {
    return false;
  }
  std::set<std::int64_t> ready;
  int missing = 0;
  for (const auto& [key, ack] : pending_) {
    if (!ack) {
      ++missing;
      continue;
    }
    for (const json& r : AckResults(*ack)) {
      if (r.value("task_status", "") != "ok") continue;
      if (step.tasks.front().task == "vcomm_id") {
        const std::string blob = r.value("blob", "");
        if (blob.size() != 2 * FALCON_TASK_BLOB_LEN) continue;
        vcomm_blob_ = blob;
      }
      ready.insert(r.value("rank", std::int64_t{-1}));
    }
  }
  std::string not_ready;  // the first 16 ranks, then how many in all
  std::size_t not_ready_count = 0;
  for (const RankTaskSpec& t : step.tasks) {
    if (ready.count(t.rank) != 0) continue;
    if (++not_ready_count <= 16) not_ready += (not_ready.empty() ? "" : ", ") + std::to_string(t.rank);
  }
  if (not_ready_count > 16) not_ready += ", ... (" + std::to_string(not_ready_count) + " ranks)";
  log_.push_back({{"step", step.what}, {"commands", pending_.size()}, {"missing_acks", missing},
                  {"not_ready", not_ready}, {"ms", MsSince(sent_ns_, now_ns)}});
  ++steps_done_;
  ++cursor_;
  if (!not_ready.empty()) {
    // Nobody has posted a transfer yet: skip them all rather than leave a peer waiting.
    p2p_failure_ = step.what + " failed on rank(s) " + not_ready + "; no transfer was posted";
    while (cursor_ < order_.size()) ++cursor_;
  }
  phase_ = cursor_ < order_.size() ? Phase::kStep : Phase::kResume;
  return true;
}

void ValidationRun::FinishStep(const JobView& view, std::int64_t now_ns) {
  const ValidationStep& step = steps_[order_[cursor_]];
  if (FinishVcommStep(step, now_ns)) return;
  const auto alone = alone_.find(order_[cursor_]);
  const bool again = alone != alone_.end() || RunBefore();
  ++(again ? steps_again_ : steps_done_);
  double alone_s = 0;  // an alone step's exchange
  std::map<std::int64_t, double> medians;  // rank -> seconds (settings_.statistic of the repetitions)
  int missing = 0, failed = 0;
  for (const auto& [key, ack] : pending_) {
    if (!ack) {
      ++missing;
      continue;
    }
    for (const json& r : AckResults(*ack)) {
      // The fastest repetition: interference (other processes, clock changes) only ever adds
      // time, so the minimum is the device's capability; a fail-slow slows every repetition.
      const double m = r.value(settings_.statistic == Statistic::kMin ? "min_s" : "median_s", 0.0);
      if (r.value("task_status", "") == "ok" && std::isfinite(m) && m > 0) {
        medians[r.value("rank", std::int64_t{-1})] = m;
      } else {
        ++failed;
      }
    }
  }
  for (const RankTaskSpec& t : step.tasks) {
    auto mine = medians.find(t.rank);
    if (mine == medians.end()) continue;
    if (t.task == "gemm") {
      const analyzer::GemmMeasurement g{static_cast<std::int32_t>(t.rank), view.NodeOf(t.rank), mine->second};
      Merge(gemms_, gemm_at_, g.rank, g);
      continue;
    }
    if (t.rank > t.peer_global) continue;  // each exchange once, from its lower rank
    auto theirs = medians.find(t.peer_global);
    if (theirs == medians.end()) continue;
    if (alone != alone_.end()) {
      alone_s = std::max(mine->second, theirs->second);
      continue;
    }
    analyzer::TransferMeasurement m{t.pass, static_cast<std::int32_t>(t.rank),
                                    static_cast<std::int32_t>(t.peer_global), view.NodeOf(t.rank),
                                    view.NodeOf(t.peer_global), std::max(mine->second, theirs->second),
                                    static_cast<std::uint64_t>(settings_.p2p_bytes)};
    Merge(t.judged ? transfers_ : peer_transfers_, t.judged ? transfer_at_ : peer_transfer_at_,
          std::tuple{m.pass, m.sender, m.receiver}, m);
  }
  json entry = {{"step", again && alone == alone_.end() ? step.what + " again" : step.what},
                {"commands", pending_.size()}, {"missing_acks", missing}, {"failed_tasks", failed},
                {"results", medians.size()}, {"ms", MsSince(sent_ns_, now_ns)}};
  if (alone != alone_.end() && alone_s > 0) FinishAlone(alone->second, alone_s, entry);
  log_.push_back(std::move(entry));
  ++cursor_;
  if (!again && !step.tasks.empty() && step.tasks.front().task == "gemm") SkipSweepIfGemmNamed();
  if (cursor_ == order_.size() && !PlanProbe(view)) PlanRemeasure();
  phase_ = cursor_ < order_.size() ? Phase::kStep : Phase::kResume;
}

void ValidationRun::SkipSweepIfGemmNamed() {
  if (!gemm_first_ || cursor_ >= order_.size()) return;
  const ValidationStep& next = steps_[order_[cursor_]];
  if (next.tasks.empty() || next.tasks.front().task == "gemm") return;  // GEMM steps still to come
  const Result<analyzer::Localization> loc = analyzer::Localize(Input(), settings_.localization);
  if (!loc.ok() || loc.value().gpus.empty()) return;
  if (const std::string why = RemeasureReason(loc.value(), settings_.remeasure ? settings_.remeasure_below : 0);
      !why.empty()) {
    return;  // an ambiguous finding: the sweep may still show what else is slow
  }
  std::string ranks;
  for (const analyzer::SlowGpu& g : loc.value().gpus) ranks += (ranks.empty() ? "" : ", ") + std::to_string(g.rank);
  const std::size_t skipped = order_.size() - cursor_;
  const auto transfers = std::count_if(order_.begin() + static_cast<std::ptrdiff_t>(cursor_), order_.end(), [&](std::size_t i) {
    return !steps_[i].tasks.empty() && steps_[i].tasks.front().task == "p2p";
  });
  p2p_skipped_ = "GEMM named rank " + ranks + " in a sweep: its " + std::to_string(transfers) +
                 " transfer steps (and the validation communicator's) were skipped";
  log_.push_back({{"step", "skip transfers"}, {"why", p2p_skipped_}, {"steps", skipped}});
  order_.resize(cursor_);
  probe_planned_ = true;  // no transfer ran: nothing to tell a NIC from a link by
}

bool ValidationRun::RunBefore() const {
  return std::find(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(cursor_), order_[cursor_]) !=
         order_.begin() + static_cast<std::ptrdiff_t>(cursor_);
}

// A slow link between nodes A and B is also what a slow NIC on A (or on B) looks like when A was
// measured against B alone: the profile often flags only the pipeline pairs, whose two nodes
// see nobody else. One more step measures each such node against other nodes (a rank there and
// a rank elsewhere, on the validation communicator), so Localize can tell the NIC (slow to
// every node) from the link (slow to one). Nothing to probe: false.
bool ValidationRun::PlanProbe(const JobView& view) {
  if (probe_planned_ || !p2p_failure_.empty()) return false;
  probe_planned_ = true;
  const Result<analyzer::Localization> loc = analyzer::Localize(Input(), settings_.localization);
  if (!loc.ok()) return false;
  std::map<std::int32_t, std::set<std::int32_t>> tested;  // node -> nodes it exchanged with
  for (const auto* list : {&transfers_, &peer_transfers_}) {
    for (const analyzer::TransferMeasurement& t : *list) {
      if (t.sender_node < 0 || t.receiver_node < 0 || t.sender_node == t.receiver_node) continue;
      tested[t.sender_node].insert(t.receiver_node);
      tested[t.receiver_node].insert(t.sender_node);
    }
  }
  std::set<std::int32_t> probe_nodes;
  for (const analyzer::SlowLink& k : loc.value().links) {
    if (k.sender_node < 0 || k.receiver_node < 0 || k.sender_node == k.receiver_node) continue;
    for (const std::int32_t n : {k.sender_node, k.receiver_node}) {
      if (tested[n].size() < settings_.localization.nic_min_links) probe_nodes.insert(n);
    }
  }
  if (probe_nodes.empty()) return false;
  std::map<std::int64_t, std::int64_t> vrank_of;  // joined ranks, from the join step
  for (const ValidationStep& st : steps_) {
    for (const RankTaskSpec& t : st.tasks) {
      if (t.task == "vcomm_join") vrank_of[t.rank] = t.vrank;
    }
  }
  std::map<std::int32_t, std::vector<std::int64_t>> ranks_on;  // node -> joined ranks
  for (const auto& [rank, vrank] : vrank_of) {
    if (const std::int32_t node = view.NodeOf(rank); node >= 0) ranks_on[node].push_back(rank);
  }
  ValidationStep probe{"p2p probe", {}};
  std::set<std::int64_t> busy;
  auto free_rank = [&](std::int32_t node) -> std::int64_t {
    for (std::int64_t r : ranks_on[node]) {
      if (!busy.count(r)) return r;
    }
    return -1;
  };
  std::uint32_t pass = kProbePassBase;
  json probed = json::array();
  for (const std::int32_t n : probe_nodes) {
    for (const auto& [other, ranks] : ranks_on) {
      if (tested[n].size() >= settings_.localization.nic_min_links) break;
      if (other == n || tested[n].count(other)) continue;
      const std::int64_t a = free_rank(n), b = free_rank(other);
      if (a < 0) break;
      if (b < 0) continue;
      probe.tasks.push_back({a, "p2p", 0, static_cast<std::int32_t>(vrank_of[b]), b, pass, true});
      probe.tasks.push_back({b, "p2p", 0, static_cast<std::int32_t>(vrank_of[a]), a, pass, true});
      ++pass;
      busy.insert({a, b});
      tested[n].insert(other);
      tested[other].insert(n);
      probed.push_back({n, other});
    }
  }
  if (probe.tasks.empty()) return false;
  steps_.push_back(std::move(probe));
  order_.push_back(steps_.size() - 1);
  log_.push_back({{"step", "probe"}, {"why", "a slow link whose node was measured against too few others"},
                  {"node_pairs", probed}});
  return true;
}

void ValidationRun::PlanRemeasure() {
  // A second pass only for what the first made: a measurement taken back lowers the baseline's
  // median, and a result just short of the threshold before may pass it now, unconfirmed.
  constexpr int kMaxPasses = 2;
  if (!settings_.remeasure || remeasure_passes_ >= kMaxPasses) return;
  const Result<analyzer::Localization> loc = analyzer::Localize(Input(), settings_.localization);
  if (!loc.ok()) return;  // the controller reports the error
  // The first pass for ambiguous findings; the second for any finding the first made, which
  // only a lowered baseline supports.
  std::string why = RemeasureReason(loc.value(), settings_.remeasure_below);
  if (remeasure_passes_ > 0) why = "new findings after re-measuring" + (why.empty() ? "" : ", " + why);
  if (why.empty()) return;
  // The steps behind each finding not measured again yet: GEMM of a slow GPU's rank, the passes
  // of a slow exchange.
  std::set<std::int64_t> gpu_ranks;
  std::set<std::pair<std::int64_t, std::int64_t>> pairs;
  for (const analyzer::SlowGpu& g : loc.value().gpus) {
    if (remeasured_gpus_.insert(g.rank).second) gpu_ranks.insert(g.rank);
  }
  auto add_link = [&](const analyzer::SlowLink& k) {
    const std::pair<std::int64_t, std::int64_t> pair{std::min(k.sender, k.receiver), std::max(k.sender, k.receiver)};
    if (remeasured_pairs_.insert(pair).second) pairs.insert(pair);
  };
  for (const analyzer::SlowLink& k : loc.value().links) add_link(k);
  for (const analyzer::SlowNic& n : loc.value().nics) {
    for (const analyzer::SlowLink& k : n.links) add_link(k);
  }
  if (gpu_ranks.empty() && pairs.empty()) return;  // every finding was measured again already
  ++remeasure_passes_;
  json again = json::array();
  json alone = json::array();
  const std::size_t planned = steps_.size();  // PlanAlone appends after these
  if (settings_.remeasure_alone && !pairs.empty() && pairs.size() <= settings_.remeasure_alone_max &&
      PlanAlone(pairs, alone)) {
    pairs.clear();  // measured alone instead of with their steps
  }
  std::vector<std::size_t> rerun;
  for (std::size_t i = 0; i < planned; ++i) {
    if (alone_.count(i) > 0) continue;  // an earlier pass's exchange alone
    const bool involved = std::any_of(steps_[i].tasks.begin(), steps_[i].tasks.end(), [&](const RankTaskSpec& t) {
      if (t.task == "gemm") return gpu_ranks.count(t.rank) > 0;
      if (t.task != "p2p") return false;  // the validation communicator is joined once per pause
      return pairs.count({std::min(t.rank, t.peer_global), std::max(t.rank, t.peer_global)}) > 0;
    });
    if (!involved) continue;
    rerun.push_back(i);
    again.push_back(steps_[i].what);
  }
  // Whole steps first, then the exchanges alone (their order: each kind's reference first).
  order_.insert(order_.begin() + static_cast<std::ptrdiff_t>(cursor_), rerun.begin(), rerun.end());
  for (const json& name : alone) again.push_back(name);
  log_.push_back({{"step", "remeasure"}, {"why", why}, {"steps", again}});
}

namespace {

// Link kinds, as Localize keeps baselines apart: NVLink and the network differ tenfold.
int KindOfLink(const analyzer::TransferMeasurement& t) {
  if (t.sender_node < 0 || t.receiver_node < 0) return 2;
  return t.sender_node == t.receiver_node ? 0 : 1;
}

}  // namespace

bool ValidationRun::PlanAlone(const std::set<std::pair<std::int64_t, std::int64_t>>& pairs, json& names) {
  struct First {
    const analyzer::TransferMeasurement* m;
    bool judged;
  };
  std::map<std::pair<std::int64_t, std::int64_t>, First> first;  // every measured exchange
  for (const auto* list : {&transfers_, &peer_transfers_}) {
    for (const analyzer::TransferMeasurement& t : *list) {
      first.insert({{std::min(t.sender, t.receiver), std::max(t.sender, t.receiver)}, {&t, list == &transfers_}});
    }
  }
  // Each kind's reference: the exchange at the (lower) median of the others of that kind.
  std::map<int, std::vector<std::pair<std::int64_t, std::int64_t>>> others;
  for (const auto& [pair, f] : first) {
    if (pairs.count(pair) == 0) others[KindOfLink(*f.m)].push_back(pair);
  }
  // The tasks of exchange a-b as some step ran them: the same peers, communicator and pass.
  auto tasks_of = [&](std::int64_t a, std::int64_t b) -> std::vector<RankTaskSpec> {
    for (const ValidationStep& s : steps_) {
      std::vector<RankTaskSpec> found;
      for (const RankTaskSpec& t : s.tasks) {
        if (t.task == "p2p" && ((t.rank == a && t.peer_global == b) || (t.rank == b && t.peer_global == a))) {
          found.push_back(t);
        }
      }
      if (found.size() == 2) return found;
    }
    return {};
  };
  std::vector<std::pair<ValidationStep, Alone>> planned;
  auto add = [&](const std::pair<std::int64_t, std::int64_t>& pair, bool reference) {
    const First& f = first.at(pair);
    std::vector<RankTaskSpec> tasks = tasks_of(pair.first, pair.second);
    if (tasks.empty()) return false;
    const std::string what = fmt::format("p2p {}-{} alone{}", pair.first, pair.second, reference ? " (reference)" : "");
    planned.push_back({ValidationStep{what, std::move(tasks)},
                       Alone{f.m->sender, f.m->receiver, f.m->pass, f.judged, KindOfLink(*f.m), reference}});
    return true;
  };
  std::map<int, std::vector<std::pair<std::int64_t, std::int64_t>>> suspects;
  for (const auto& pair : pairs) {
    const auto f = first.find(pair);
    if (f == first.end()) return false;  // not measured (a NIC's link measured by a peer only)
    suspects[KindOfLink(*f->second.m)].push_back(pair);
  }
  for (const auto& [kind, list] : suspects) {
    std::vector<std::pair<std::int64_t, std::int64_t>>& pool = others[kind];
    if (pool.empty()) return false;  // nothing to scale by
    std::sort(pool.begin(), pool.end(), [&](const auto& x, const auto& y) {
      return first.at(x).m->median_s < first.at(y).m->median_s;
    });
    if (!add(pool[(pool.size() - 1) / 2], true)) return false;
    for (const auto& pair : list) {
      if (!add(pair, false)) return false;
    }
  }
  for (auto& [step, a] : planned) {
    names.push_back(step.what);
    steps_.push_back(std::move(step));
    alone_[steps_.size() - 1] = a;
    order_.push_back(steps_.size() - 1);
  }
  return true;
}

void ValidationRun::FinishAlone(const Alone& a, double seconds, json& log_entry) {
  log_entry["alone_s"] = seconds;
  const std::tuple key{a.pass, a.sender, a.receiver};
  auto& list = a.judged ? transfers_ : peer_transfers_;
  auto& at = a.judged ? transfer_at_ : peer_transfer_at_;
  const auto it = at.find(key);
  if (it == at.end()) return;
  if (a.reference) {
    reference_[a.kind] = {seconds, list[it->second].median_s};
    return;
  }
  const auto ref = reference_.find(a.kind);
  if (ref == reference_.end()) {
    log_entry["kept"] = "no reference measured alone: the first measurement stands";
    return;
  }
  const auto [ref_alone, ref_first] = ref->second;
  analyzer::TransferMeasurement m = list[it->second];
  m.median_s = ref_first * seconds / ref_alone;
  log_entry["reference_alone_s"] = ref_alone;
  log_entry["as_s"] = m.median_s;  // on the scale of the first measurements
  Merge(list, at, key, m);
}

std::vector<OutgoingCommand> ValidationRun::SendResume(const JobView& view, std::int64_t now_ns) {
  NewStep();
  std::vector<OutgoingCommand> out = AwaitFromEveryAgent(view, "resume", now_ns);
  deadline_ns_ = AfterSeconds(now_ns, settings_.ack_timeout_s);
  // After a missed cut, wait for every agent to answer the release (agents with nothing paused
  // refuse it at once) before arming the next pause, so no rank is still trapped by the old one.
  retry_pause_ = !paused_ && failure_.empty();
  sent_ns_ = now_ns;
  phase_ = Phase::kAwaitResume;
  return out;
}

analyzer::LocalizationInput ValidationRun::Input() const {
  analyzer::LocalizationInput in;
  in.transfers = transfers_;
  in.peer_transfers = peer_transfers_;
  in.gemms = gemms_;
  return in;
}

json GemmTimesJson(const std::vector<analyzer::GemmMeasurement>& gemms, std::size_t listed) {
  std::vector<const analyzer::GemmMeasurement*> by_time;
  for (const analyzer::GemmMeasurement& g : gemms) by_time.push_back(&g);
  std::sort(by_time.begin(), by_time.end(), [](const auto* a, const auto* b) {
    return a->median_s > b->median_s || (a->median_s == b->median_s && a->rank < b->rank);
  });
  json times = json::object();
  for (std::size_t i = 0; i < by_time.size() && i < listed; ++i) times[std::to_string(by_time[i]->rank)] = by_time[i]->median_s;
  json out = {{"gemm_s", std::move(times)}};
  if (by_time.size() > listed) {
    out["gemm_spread"] = {{"ranks", by_time.size()},
                          {"max_s", by_time.front()->median_s},
                          {"median_s", by_time[by_time.size() / 2]->median_s},
                          {"min_s", by_time.back()->median_s}};
  }
  return out;
}

json ValidationRun::Summary() const {
  json s = {{"steps_planned", steps_.size()},
            {"steps_done", steps_done_},
            {"steps_remeasured", steps_again_},
            {"pause_attempts", pause_attempt_ + (paused_ ? 1 : 0)},
            {"gemms", gemms_.size()},
            {"transfers", transfers_.size()},
            {"peer_transfers", peer_transfers_.size()},
            {"log", log_}};
  s.update(GemmTimesJson(gemms_));
  json p2p = json::array();
  for (const auto* list : {&transfers_, &peer_transfers_}) {
    for (const analyzer::TransferMeasurement& t : *list) {
      p2p.push_back({{"ranks", {t.sender, t.receiver}}, {"pass", t.pass}, {"median_s", t.median_s},
                     {"judged", list == &transfers_}});
    }
  }
  s["p2p"] = p2p;
  if (paused_ && resumed_ns_ > paused_ns_) s["pause_s"] = static_cast<double>(resumed_ns_ - paused_ns_) / kNsPerS;
  if (!failure_.empty()) s["failure"] = failure_;
  if (!p2p_failure_.empty()) s["p2p_failure"] = p2p_failure_;
  if (!p2p_skipped_.empty()) s["p2p_skipped"] = p2p_skipped_;
  return s;
}

}  // namespace falcon::controller
