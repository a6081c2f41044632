// SimAgents, the controller's side: reading commands, answering them with modelled timings, and
// the profile windows the controller asks for. See sim_agents.h.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "bench/sim/sim_agents.h"
#include "daemon/protocol/keys.h"
#include "daemon/redis/redis_commands.h"
#include "falcon/protocol.h"

namespace falcon::sim {
namespace {

using json = nlohmann::json;

constexpr std::uint64_t kReadCount = 256;   // command entries per stream per read
constexpr double kTrapLeadS = 0.002;        // a trapped rank's ack after it reaches its cut

std::string Hex16(std::uint64_t x) { return protocol::CommIdHex(x); }

}  // namespace

// The sim's own hash (not the protocol's): each validation communicator's members, vrank -> rank,
// shared by the worker processes.
std::string SimAgents::VcommKey() const { return "falcon-sim:{" + job_name_ + "}:vcomm"; }
// Iteration -> the wall time the job resumed at after a pause held it there.
std::string SimAgents::HoldsKey() const { return "falcon-sim:{" + job_name_ + "}:holds"; }

void SimAgents::HoldAtCut(const protocol::Command& pause, std::uint64_t k) {
  if (hold_ && hold_->iteration == k) return;  // another of this process's hosts: held already
  // The trap's own deadline, the same in every process: the job goes on by itself then.
  const std::int64_t deadline = pause.issued_ns + static_cast<std::int64_t>(pause.max_pause_s * 1e9);
  job_.Hold(k, deadline);
  hold_ = OpenHold{k, deadline};
}

void SimAgents::ReleaseHold(std::int64_t now_ns) {
  if (!hold_) return;
  // The first process to read a resume sets the time; the others take it (a job resumes as one:
  // its ranks' next collectives wait for the last of them, and the sim's own read lag is not the
  // job's).
  std::int64_t at = now_ns;
  const std::string field = std::to_string(hold_->iteration);
  counters_.redis_commands += 3;
  Result<std::vector<redis::RedisReply>> r = conn_->Pipeline(
      {{"HSETNX", HoldsKey(), field, std::to_string(now_ns)}, {"EXPIRE", HoldsKey(), "600"}, {"HGET", HoldsKey(), field}});
  if (r.ok() && r.value().size() == 3 && r.value()[2].type == redis::RedisReply::Type::kString) {
    try {
      at = std::stoll(r.value()[2].str);
    } catch (const std::exception&) {
      at = now_ns;  // not ours: keep this process's own time
    }
  }
  job_.Hold(hold_->iteration, std::min(at, hold_->deadline_ns));
  hold_.reset();
}

std::vector<SimAgents::RankState*> SimAgents::Targets(const std::string& host, const protocol::Command& c) {
  std::vector<RankState*> out;
  const std::int64_t node = node_of_host_.at(host);
  if (!c.ranks) {  // the node's own ranks, not a scan of the job's (that was O(N) per host)
    for (auto [it, end] = NodeRanks(node); it != end; ++it) out.push_back(&it->second);
    return out;
  }
  for (std::int64_t r : *c.ranks) {
    auto it = ranks_.find(r);
    if (it != ranks_.end() && job_.Node(r) == node) out.push_back(&it->second);
  }
  return out;
}

Status SimAgents::ReadCommands(std::int64_t now_ns) {
  const std::string group = protocol::CommandGroup(consumer_);
  const std::string broadcast = Key(protocol::kBroadcastStream);
  std::vector<std::string> argv = {"XREADGROUP", "GROUP", group, consumer_, "COUNT", std::to_string(kReadCount), "STREAMS"};
  for (const auto& [host, node] : node_of_host_) argv.push_back(Key(protocol::kCommandsStream, host));
  if (cadence_.broadcast) argv.push_back(broadcast);
  argv.insert(argv.end(), node_of_host_.size() + (cadence_.broadcast ? 1 : 0), ">");
  ++counters_.redis_commands;
  Result<redis::RedisReply> reply = conn_->Command(argv);
  if (!reply.ok()) {
    // NOGROUP: Redis lost the group (a restart without persistence): make them again.
    if (reply.status().code() == Status::Code::kInvalidArgument) groups_made_ = false;
    return reply.status().code() == Status::Code::kInvalidArgument ? Status::Ok() : reply.status();
  }
  Result<std::vector<redis::StreamRead>> reads = redis::ParseStreamReads(reply.value());
  if (!reads.ok()) return reads.status();
  now_ns = ClockNs(now_ns);  // read now
  for (const redis::StreamRead& read : reads.value()) {
    // A host's own stream (the key's last part is the host), or the broadcast: every host here.
    const bool to_all = read.stream == broadcast;
    const std::string host = to_all ? std::string() : read.stream.substr(read.stream.rfind(':') + 1);
    if (!to_all && !node_of_host_.count(host)) continue;
    std::vector<std::string> ids;
    for (const redis::StreamEntry& e : read.entries) {
      ids.push_back(e.id);
      const std::string* text = e.Field(std::string(protocol::kPayloadField));
      if (text == nullptr) continue;
      Result<protocol::Command> c = protocol::ParseCommand(*text);
      if (!c.ok()) {
        ++counters_.commands["invalid"];
        continue;
      }
      ++counters_.commands[c.value().type];
      counters_.command_read_lag_ms[c.value().type].Add(static_cast<double>(now_ns - c.value().issued_ns) / 1e6);
      if (!to_all) {
        Handle(host, c.value(), now_ns);
        continue;
      }
      for (const auto& [h, node] : node_of_host_) Handle(h, c.value(), now_ns);
    }
    std::vector<std::string> xack = {"XACK", read.stream, group};
    xack.insert(xack.end(), ids.begin(), ids.end());
    Queue(std::move(xack));
  }
  return Status::Ok();
}

double SimAgents::GemmSeconds(std::int64_t rank, std::int64_t size, std::int64_t now_ns) const {
  double factor = 1.0;
  for (const SimFault& f : job_.faults()) {
    if (f.kind == "compute" && job_.Active(f, now_ns) && std::count(f.ranks.begin(), f.ranks.end(), rank)) {
      factor = std::max(factor, f.factor);
    }
  }
  const double n = static_cast<double>(size);
  return 2.0 * n * n * n / (device_.gemm_tflops * 1e12) * factor;
}

double SimAgents::P2pSeconds(std::int64_t rank, std::int64_t peer, std::int64_t bytes, std::int64_t now_ns) const {
  const std::int64_t a = job_.Node(rank), b = job_.Node(peer);
  double factor = 1.0;
  for (const SimFault& f : job_.faults()) {
    if (!job_.Active(f, now_ns) || a == b) continue;
    const bool hit = (f.kind == "link" && ((f.nodes[0] == a && f.nodes[1] == b) || (f.nodes[0] == b && f.nodes[1] == a))) ||
                     (f.kind == "nic" && (f.nodes[0] == a || f.nodes[0] == b));
    if (hit) factor = std::max(factor, f.factor);
  }
  const double gbps = a == b ? device_.intra_node_gbps : device_.inter_node_gbps;
  return device_.latency_s + static_cast<double>(bytes) / (gbps * 1e9) * factor;
}

std::optional<std::int64_t> SimAgents::VcommPeer(const std::string& blob, std::int64_t vrank) {
  auto it = vcomm_members_.find(blob);
  if (it == vcomm_members_.end()) {  // every member has joined before any transfer: read them once
    ++counters_.redis_commands;
    Result<std::map<std::string, std::string>> h = redis::HGetAll(*conn_, VcommKey());
    if (!h.ok()) return std::nullopt;
    std::map<std::int64_t, std::int64_t> members;
    const std::string prefix = blob.substr(0, 32) + ":";
    for (const auto& [field, value] : h.value()) {
      if (field.rfind(prefix, 0) != 0) continue;
      members[std::stoll(field.substr(prefix.size()))] = std::stoll(value);
    }
    it = vcomm_members_.emplace(blob, std::move(members)).first;
  }
  auto m = it->second.find(vrank);
  if (m == it->second.end()) return std::nullopt;
  return m->second;
}

void SimAgents::Handle(const std::string& host, const protocol::Command& c, std::int64_t now_ns) {
  Pending p;
  p.due_ns = now_ns;
  protocol::Ack& ack = p.ack;
  ack.header = Header(node_of_host_.at(host), now_ns);
  ack.command = c.id;
  ack.command_type = c.type;
  ack.status = "ok";
  if (c.deadline_ns && now_ns > *c.deadline_ns) {
    ack.status = "expired";
    pending_.push_back(std::move(p));
    return;
  }
  std::vector<RankState*> targets = Targets(host, c);
  double longest_s = 0;
  std::optional<std::uint64_t> cut;  // pause: the iteration its cut comes before
  if (c.type == "resume") ReleaseHold(now_ns);
  for (RankState* r : targets) {
    protocol::AckRankResult res;
    res.rank = r->rank;
    if (c.type == "set_mode") {
      r->mode = c.mode;  // its profile window restarts when the ack goes out (SendDueAcks), as an agent's does
      ack.ranks.push_back(r->rank);
      continue;  // set_mode acks carry no results
    }
    if (c.type == "plan") {
      r->plan_delivered = c.plan_version;
      r->plan_applied = c.plan_version;  // the modelled framework applies it at once
      res.state = "delivered";
    } else if (c.type == "cut_info") {
      const std::int64_t t = now_ns - job_.Skew(r->rank);
      const std::uint64_t k = job_.IterationsBefore(t);
      const std::uint64_t base = k == 0 ? 0 : k - 1;
      protocol::CutPatternMessage m;
      m.pattern = job_.Pattern(r->rank, base);
      const SimJob::Iteration it = job_.IterationAt(base);
      const double frac = std::clamp(static_cast<double>(t - it.start_ns) / (it.seconds * 1e9), 0.0, 0.999);
      m.position = static_cast<std::uint64_t>(frac * static_cast<double>(m.pattern.units.size()));
      m.units_per_s = static_cast<double>(m.pattern.units.size()) / it.seconds;
      m.age_s = 0.001;
      res.state = "ok";
      res.pattern = protocol::CutPatternToJson(m);
    } else if (c.type == "pause") {
      // The rank stops when it reaches its cut: the iteration whose calls the targets count.
      double wait_s = 0;
      for (const protocol::Command::RankTargets& t : c.targets) {
        if (t.rank != r->rank || t.targets.empty()) continue;
        for (const SimComm& sc : r->comms) {
          if (sc.id != t.targets[0].comm) continue;
          const std::uint64_t iteration = t.targets[0].expect_seq / std::max<std::uint64_t>(1, sc.calls_per_iteration);
          if (!cut) cut = iteration;
          const std::int64_t at = job_.UnheldStart(iteration) + job_.Skew(r->rank);
          if (at < now_ns) ++counters_.late_traps;
          wait_s = std::max(0.0, static_cast<double>(at - now_ns) / 1e9);
        }
      }
      longest_s = std::max(longest_s, wait_s + kTrapLeadS);
      res.state = "trapped";
    } else if (c.type == "resume") {
      res.state = "resumed";
    } else if (c.type == "validate") {
      res.state = "done";
      res.task_status = "ok";
      double s = 0.001;
      const std::int64_t repeats = c.repeats.value_or(5);
      if (c.task == "gemm") {
        s = GemmSeconds(r->rank, c.size.value_or(8192), now_ns);
        res.dtype = c.dtype.value_or("fp32");
        res.rate = 2.0 * std::pow(static_cast<double>(c.size.value_or(8192)), 3) / s / 1e9;
      } else if (c.task == "vcomm_id") {
        std::string blob;
        for (int i = 0; i < 16; ++i) blob += Hex16(Mix(static_cast<std::uint64_t>(now_ns) ^ (static_cast<std::uint64_t>(i) << 40) ^ counters_.acks));
        res.blob = blob;
      } else if (c.task == "vcomm_join") {
        if (const std::optional<std::int64_t> vrank = protocol::VrankOf(c, r->rank); c.blob && vrank) {
          Queue({"HSET", VcommKey(), c.blob->substr(0, 32) + ":" + std::to_string(*vrank), std::to_string(r->rank)});
          Queue({"EXPIRE", VcommKey(), "600"});
          vcomm_[r->rank] = {*c.blob, *vrank, c.vranks.value_or(0)};
          s = 0.05;
        }
      } else if (c.task == "p2p") {
        const std::optional<std::int64_t> peer = protocol::PeerOf(c, r->rank);
        // Validation rank v sends to v + shift and receives from v - shift (mod vranks), or
        // exchanges with `peer`; the rank's time is its slower direction.
        auto v = vcomm_.find(r->rank);
        std::optional<std::int64_t> next, prev;
        if (v != vcomm_.end() && v->second.vranks > 1) {
          const std::int64_t n = v->second.vranks;
          const std::int64_t shift = peer ? 0 : c.shift.value_or(1) % n;
          next = VcommPeer(v->second.blob, peer ? *peer : (v->second.vrank + shift) % n);
          prev = peer ? next : VcommPeer(v->second.blob, (v->second.vrank - shift + n) % n);
        }
        const std::int64_t bytes = c.bytes.value_or(64 << 20);
        if (!next || !prev) {
          res.task_status = "failed";
        } else {
          s = std::max(P2pSeconds(r->rank, *next, bytes, now_ns), P2pSeconds(*prev, r->rank, bytes, now_ns));
          res.rate = static_cast<double>(bytes) / s / 1e9;
        }
      }
      res.median_s = s;
      res.min_s = s * 0.98;
      res.max_s = s * 1.03;
      longest_s = std::max(longest_s, s * static_cast<double>(repeats + 1));
    } else {  // progress: the modelled job never hangs
      ack.status = "unsupported";
      ack.detail = "falcon-sim does not model per-call progress";
      break;
    }
    ack.ranks.push_back(r->rank);
    ack.results.push_back(std::move(res));
  }
  if (c.type == "validate") {  // a failed member fails the task, as ShimTrap reports it
    for (const protocol::AckRankResult& res : ack.results) {
      if (res.task_status != "ok" && ack.status == "ok") {
        ack.status = "failed";
        ack.detail = "rank " + std::to_string(res.rank) + ": done " + *res.task_status;
      }
    }
  }
  if (cut && ack.status == "ok") HoldAtCut(c, *cut);
  p.due_ns = now_ns + static_cast<std::int64_t>(longest_s * 1e9);
  pending_.push_back(std::move(p));
}

void SimAgents::SendDueAcks(std::int64_t now_ns) {
  auto due = std::stable_partition(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.due_ns > now_ns; });
  for (auto it = due; it != pending_.end(); ++it) {
    it->ack.header.at_ns = now_ns;
    counters_.ack_lag_ms[it->ack.command_type].Add(static_cast<double>(now_ns - it->due_ns) / 1e6);
    if (it->ack.command_type == "set_mode") {
      for (std::int64_t rank : it->ack.ranks) {
        if (auto r = ranks_.find(rank); r != ranks_.end()) r->second.profile_since_ns = now_ns;
      }
    }
    QueueReport(protocol::kAcksStream, protocol::ToJson(it->ack), "ack", -1);  // acks go alone
    ++counters_.acks;
  }
  pending_.erase(due, pending_.end());
}

void SimAgents::PublishProfiles(std::int64_t node, std::int64_t now_ns) {
  for (auto [r, end] = NodeRanks(node); r != end; ++r) {
    const std::int64_t rank = r->first;
    RankState& s = r->second;
    if (s.mode != "profile" && s.mode != "sample") continue;
    if (now_ns - s.profile_since_ns < std::int64_t{cadence_.profile_ms} * 1'000'000) continue;
    protocol::CommProfileReport m;
    m.header = Header(node, now_ns);
    m.rank = rank;
    m.pid = s.pid;
    m.since_ns = s.profile_since_ns;
    m.mode = s.mode;
    for (const SimComm& c : s.comms) {
      protocol::CommProfile cp{c.id, c.rank, c.nranks, {}};
      const std::uint64_t now_calls = IssuedCalls(c, rank, now_ns);
      const std::uint64_t calls = now_calls - std::min(now_calls, IssuedCalls(c, rank, s.profile_since_ns));
      const std::vector<Signature> sigs = ProfileSignatures(c);
      for (const Signature& sig : sigs) {
        protocol::SignatureProfile sp;
        sp.op = sig.op;
        sp.bytes = sig.bytes;
        sp.peer = sig.peer;
        sp.count = std::max<std::uint64_t>(1, calls / sigs.size());
        const double us = CallMicros(rank, c, sig, now_ns);
        sp.mean_us = us;
        sp.median_us = us;
        sp.clock = "device";
        cp.sigs.push_back(std::move(sp));
      }
      m.comms.push_back(std::move(cp));
    }
    QueueReport(protocol::kProfilesStream, protocol::ToJson(m), "comm_profile", node);
    s.profile_since_ns = now_ns;
  }
}

}  // namespace falcon::sim
