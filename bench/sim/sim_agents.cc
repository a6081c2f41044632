// SimAgents: see sim_agents.h.
#include "bench/sim/sim_agents.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <time.h>
#include <unistd.h>

#include "daemon/protocol/keys.h"
#include "daemon/redis/redis_commands.h"
#include "falcon/protocol.h"
#include "falcon/shm_abi.h"

namespace falcon::sim {
namespace {

using json = nlohmann::json;

constexpr std::int32_t kBf16 = 9;                  // ncclBfloat16
constexpr std::uint64_t kBlock = protocol::kSignatureBlockCalls;
constexpr const char* kVersion = "sim-0.1";

}  // namespace

std::int64_t SimAgents::ClockNs(std::int64_t not_before_ns) {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return std::max(not_before_ns, static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec);
}

std::string SimAgents::Key(const protocol::KeySpec& spec, const std::string& host, std::optional<std::int64_t> rank) const {
  Result<std::string> k = protocol::FormatKey(spec, {job_name_, host, rank});
  return k.ok() ? k.value() : std::string();  // the job name is checked in main, host names are ours
}

SimAgents::SimAgents(SimJob job, std::string job_name, std::int64_t first_node, std::int64_t end_node, int worker,
                     AgentCadence cadence, DeviceModel device, std::unique_ptr<redis::RedisConnection> conn)
    : job_(std::move(job)),
      job_name_(std::move(job_name)),
      first_node_(first_node),
      end_node_(end_node),
      consumer_("sim-worker-" + std::to_string(worker)),
      cadence_(cadence),
      device_(device),
      conn_(std::move(conn)) {
  const std::int64_t n = job_.shape().ranks();
  for (std::int64_t node = first_node_; node < end_node_; ++node) {
    node_of_host_[job_.Host(node)] = node;
    for (std::int64_t r = node * job_.shape().gpus_per_node; r < std::min(n, (node + 1) * job_.shape().gpus_per_node);
         ++r) {
      RankState s;
      s.rank = r;
      s.pid = 1000 + r % 4000000;
      s.comms = job_.Comms(r);
      ranks_.emplace(r, std::move(s));
    }
  }
}

nlohmann::json LatencySummary(std::vector<double> v) {
  nlohmann::json out = {{"n", v.size()}};
  if (v.empty()) return out;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))]; };
  out["p50"] = at(0.5);
  out["p99"] = at(0.99);
  out["max"] = v.back();
  return out;
}

void LatencySample::Add(double v) {
  max_ = n_ == 0 ? v : std::max(max_, v);
  ++n_;
  if (kept_.size() < capacity_) {
    kept_.push_back(v);
    return;
  }
  rng_ ^= rng_ << 13;
  rng_ ^= rng_ >> 7;
  rng_ ^= rng_ << 17;
  const std::uint64_t j = rng_ % n_;  // keep the n-th value with probability capacity / n
  if (j < capacity_) kept_[j] = v;
}

nlohmann::json LatencySummary(const LatencySample& s) {
  nlohmann::json out = LatencySummary(s.kept());
  out["n"] = s.n();
  if (s.n() > 0) out["max"] = s.max();
  return out;
}

protocol::ReportHeader SimAgents::Header(std::int64_t node, std::int64_t now_ns) const {
  return {job_name_, job_.Host(node), now_ns};
}

void SimAgents::Queue(std::vector<std::string> argv) { queue_.push_back(std::move(argv)); }

void SimAgents::QueueReport(const protocol::KeySpec& stream, const json& msg, const std::string& type,
                            std::int64_t node) {
  ++counters_.messages[type];
  std::string text = msg.dump();
  const std::string key = Key(stream);
  // As the agent packs its outbox: consecutive reports of one node for one stream share an entry.
  if (node < 0 || node != pack_node_ || key != pack_key_ || pack_.size() >= protocol::kPackMessages ||
      pack_bytes_ + text.size() > protocol::kPackBytes) {
    ClosePack();
  }
  if (node < 0) {
    Queue(redis::XAddArgs(key, cadence_.stream_maxlen, {{std::string(protocol::kPayloadField), std::move(text)}}));
    return;
  }
  pack_node_ = node;
  pack_key_ = key;
  pack_bytes_ += text.size();
  pack_.emplace_back(std::string(protocol::kPayloadField), std::move(text));
}

void SimAgents::ClosePack() {
  if (!pack_.empty()) Queue(redis::XAddArgs(pack_key_, protocol::EntryCap(cadence_.stream_maxlen, pack_.size()), pack_));
  pack_.clear();
  pack_bytes_ = 0;
  pack_node_ = -1;
}

Status SimAgents::Flush() {
  ClosePack();
  counters_.redis_commands += queue_.size();
  Result<std::vector<redis::RedisReply>> r = redis::PipelineInRounds(*conn_, queue_);
  queue_.clear();
  if (!r.ok()) return r.status();
  for (const redis::RedisReply& x : r.value()) counters_.redis_errors += x.type == redis::RedisReply::Type::kError;
  return Status::Ok();
}

Status SimAgents::Tick(std::int64_t now_ns) {
  if (!groups_made_) {
    // One group for this process on each of its hosts' streams and on the broadcast stream
    // (an agent's group is its host's; here one process reads for many hosts).
    std::vector<std::string> streams;
    for (const auto& [host, node] : node_of_host_) streams.push_back(Key(protocol::kCommandsStream, host));
    if (cadence_.broadcast) streams.push_back(Key(protocol::kBroadcastStream));
    for (const std::string& stream : streams) {
      std::vector<std::string> argv = {"XGROUP", "CREATE", stream, protocol::CommandGroup(consumer_), "$", "MKSTREAM"};
      Queue(std::move(argv));  // BUSYGROUP from an earlier run is an error reply, harmless
    }
    if (Status s = Flush(); !s.ok()) return s;
    counters_.redis_errors = 0;
    groups_made_ = true;
  }
  if (due_.empty()) due_.resize(static_cast<std::size_t>(end_node_ - first_node_));
  for (std::int64_t node = first_node_; node < end_node_; ++node) {
    NodeDue& d = due_[static_cast<std::size_t>(node - first_node_)];
    // After its first report (at the first tick, so every rank registers at once), node n keeps
    // the phase (n x golden ratio mod 1) of each cadence: spread evenly whatever the node count.
    const double phase = std::fmod(static_cast<double>(node) * 0.6180339887498949, 1.0);
    auto next = [&](std::int64_t& at, int cadence_ms) {
      const auto period = std::int64_t{cadence_ms} * 1'000'000;
      at = at == 0 ? now_ns + static_cast<std::int64_t>(phase * static_cast<double>(period)) : at + period;
      if (at <= now_ns) at = now_ns + period;  // fell behind: skip, as a busy agent's timer would
    };
    if (now_ns >= d.heartbeat_ns) {
      Register(node, now_ns);
      next(d.heartbeat_ns, cadence_.heartbeat_ms);
    }
    if (now_ns >= d.flush_ns) {
      PublishIterations(node, now_ns);
      PublishProfiles(node, now_ns);
      next(d.flush_ns, cadence_.flush_ms);
    }
    if (cadence_.signature_ms > 0 && now_ns >= d.signature_ns) {
      PublishSignatures(node, now_ns);
      next(d.signature_ns, cadence_.signature_ms);
    }
  }
  SendDueAcks(now_ns);
  if (Status s = Flush(); !s.ok()) return s;
  if (Status s = ReadCommands(now_ns); !s.ok()) return s;
  SendDueAcks(ClockNs(now_ns));
  if (Status s = Flush(); !s.ok()) return s;
  registered_ = true;
  return Status::Ok();
}

std::uint64_t SimAgents::IssuedCalls(const SimComm& c, std::int64_t rank, std::int64_t t_ns) {
  const std::int64_t t = t_ns - job_.Skew(rank);
  const std::uint64_t k = job_.IterationsBefore(t);  // iteration k-1 is running at t
  if (k == 0) return 0;
  const SimJob::Iteration it = job_.IterationAt(k - 1);
  const double frac = std::clamp(static_cast<double>(t - it.start_ns) / (it.seconds * 1e9), 0.0, 1.0);
  // The DP bucket calls come at the end of the iteration; the rest spread evenly over it.
  const double done = c.kind == "dp" ? (frac > 0.95 ? 1.0 : 0.0) : frac;
  return (k - 1) * c.calls_per_iteration +
         static_cast<std::uint64_t>(std::floor(done * static_cast<double>(c.calls_per_iteration)));
}

std::pair<SimAgents::RankIt, SimAgents::RankIt> SimAgents::NodeRanks(std::int64_t node) {
  const std::int64_t gpn = job_.shape().gpus_per_node;
  return {ranks_.lower_bound(node * gpn), ranks_.lower_bound((node + 1) * gpn)};
}

void SimAgents::Register(std::int64_t node, std::int64_t now_ns) {
  std::vector<std::int64_t> ranks;
  std::vector<protocol::RankBeat> beats;
  for (auto [r, end] = NodeRanks(node); r != end; ++r) {
    const std::int64_t rank = r->first;
    RankState& s = r->second;
    ranks.push_back(rank);
    protocol::RankRegistration m;
    m.header = Header(node, now_ns);
    m.rank = rank;
    m.pid = s.pid;
    m.local_rank = rank % job_.shape().gpus_per_node;
    m.exe = "falcon-sim";
    m.started_ns = job_.start_ns();
    m.mode = s.mode;
    std::uint64_t records = 0;
    for (const SimComm& c : s.comms) {
      const std::uint64_t calls = IssuedCalls(c, rank, now_ns);
      records += calls;
      m.comms.push_back({c.id, c.rank, c.nranks, c.kind, calls});
    }
    m.records = records;
    if (s.next_sample > 0) m.period = job_.Period(rank);
    m.iterations = s.next_sample;
    m.slow = s.slow;
    if (s.plan_delivered) m.plan_delivered = static_cast<std::uint32_t>(*s.plan_delivered);
    if (s.plan_applied) m.plan_applied = static_cast<std::uint32_t>(*s.plan_applied);
    if (s.key_writer.Next(m, now_ns, std::int64_t{cadence_.key_ttl_s} * 1'000'000'000,
                          std::int64_t{cadence_.heartbeat_ms} * 1'000'000, beats.emplace_back())) {
      const std::string key = Key(protocol::kRankKey, {}, rank);
      Queue(redis::HSetArgs(key, {{std::string(protocol::kPayloadField), s.key_writer.payload()},
                                  {"host", job_.Host(node)},
                                  {"pid", std::to_string(s.pid)},
                                  {"state", "live"}}));
      Queue(redis::ExpireArgs(key, cadence_.key_ttl_s));
      ++counters_.messages["rank_register"];
    }
  }
  protocol::AgentHeartbeat h;
  h.header = Header(node, now_ns);
  h.pid = 100000 + node % 4000000;
  h.version = kVersion;
  h.started_ns = job_.start_ns();
  h.ranks = std::move(ranks);
  h.broadcast = cadence_.broadcast;
  h.beats = std::move(beats);
  const std::string key = Key(protocol::kAgentKey, job_.Host(node));
  Queue(redis::HSetArgs(key, {{std::string(protocol::kPayloadField), protocol::ToJson(h).dump()},
                              {"pid", std::to_string(h.pid)}}));
  Queue(redis::ExpireArgs(key, cadence_.key_ttl_s));
  ++counters_.messages["agent_heartbeat"];
}

void SimAgents::PublishIterations(std::int64_t node, std::int64_t now_ns) {
  for (auto [r, end] = NodeRanks(node); r != end; ++r) {
    const std::int64_t rank = r->first;
    RankState& s = r->second;
    protocol::IterationBatch b;
    b.header = Header(node, now_ns);
    b.rank = rank;
    b.pid = s.pid;
    b.period = job_.Period(rank);
    b.first = s.next_sample;
    const std::int64_t skew = job_.Skew(rank);
    // Sample k is done once iteration k+1 has started on this rank. Its time is from boundary to
    // boundary, as an agent measures it: a pause before k+1 counts in it.
    while (job_.IterationAt(s.next_sample + 1).start_ns + skew <= now_ns && b.seconds.size() < 4096) {
      const SimJob::Iteration it = job_.IterationAt(s.next_sample);
      const double seconds = static_cast<double>(job_.IterationAt(s.next_sample + 1).start_ns - it.start_ns) / 1e9;
      const double jitter = 1.0 + 0.002 * (static_cast<double>(Mix(static_cast<std::uint64_t>(rank) * 1000003u +
                                                                   s.next_sample) % 1000) / 500.0 - 1.0);
      b.start_ns.push_back(it.start_ns + skew);
      b.seconds.push_back(seconds * jitter);
      Detect(s, s.next_sample, now_ns);
      ++s.next_sample;
    }
    if (!b.seconds.empty()) QueueReport(protocol::kIterationsStream, protocol::ToJson(b), "iterations", node);
  }
}

// The agent's detector, modelled: the job's level (its noise-free slowdown) crossing the alarm
// threshold for detect_samples samples in a row raises `slow`; back below it, `recovered`.
void SimAgents::Detect(RankState& r, std::uint64_t sample, std::int64_t now_ns) {
  const SimJob::Iteration it = job_.IterationAt(sample);
  const double level = job_.Slowdown(it.start_ns);
  const bool slow_now = level >= cadence_.alarm_threshold;
  if (slow_now == r.slow) {
    r.level_run = 0;
    r.level_onset.reset();
    return;
  }
  if (!r.level_onset) r.level_onset = sample;
  if (++r.level_run < static_cast<std::uint64_t>(cadence_.detect_samples)) return;
  r.slow = slow_now;
  protocol::AlarmReport a;
  a.header = Header(job_.Node(r.rank), now_ns);
  a.rank = r.rank;
  a.pid = r.pid;
  a.kind = slow_now ? "slow" : "recovered";
  a.onset = *r.level_onset;
  a.at = sample;
  a.onset_ns = job_.IterationAt(*r.level_onset).start_ns + job_.Skew(r.rank);
  a.ratio = level;
  a.probability = 0.99;
  a.baseline_s = job_.shape().iteration_s;
  a.level_s = job_.shape().iteration_s * level;
  QueueReport(protocol::kAlarmsStream, protocol::ToJson(a), "alarm", job_.Node(r.rank));
  protocol::Alert alert;
  alert.job = job_name_;
  alert.at_ns = now_ns;
  alert.severity = slow_now ? "warning" : "info";
  alert.source = "agent";
  alert.host = job_.Host(job_.Node(r.rank));
  alert.rank = r.rank;
  char summary[160];
  std::snprintf(summary, sizeof summary, "rank %lld on %s is %s: %.2fx its healthy iteration time",
                static_cast<long long>(r.rank), alert.host->c_str(), slow_now ? "slow" : "back", level);
  alert.summary = summary;
  Queue(redis::PublishArgs(Key(protocol::kAlertsChannel), protocol::ToJson(alert).dump()));
  ++counters_.messages["alert"];
  r.level_run = 0;
  r.level_onset.reset();
}

void SimAgents::PublishSignatures(std::int64_t node, std::int64_t now_ns) {
  for (auto [r, end] = NodeRanks(node); r != end; ++r) {
    const std::int64_t rank = r->first;
    RankState& s = r->second;
    protocol::CallSignatures m;
    m.header = Header(node, now_ns);
    m.rank = rank;
    m.pid = s.pid;
    for (const SimComm& c : s.comms) {
      if (c.kind == "pp") continue;  // sends and receives are left out
      const bool tp = c.kind == "tp";
      std::uint64_t& signed_calls = tp ? s.signed_tp : s.signed_dp;
      std::uint64_t& block = tp ? s.block_tp : s.block_dp;
      const std::uint64_t issued = IssuedCalls(c, rank, now_ns);
      if (issued <= signed_calls) continue;
      const std::uint64_t dp_count = kDpBytes / 2 / static_cast<std::uint64_t>(c.nranks);
      // As the agent's SignatureLog: calls below the full seqs (rounded up to a block) as runs,
      // later ones as one digest per block once a call two blocks on was issued. (A simulated
      // communicator never stalls, so the agent's idle-time runs do not arise.)
      const std::uint64_t full = (cadence_.signature_full_seqs + kBlock - 1) / kBlock * kBlock;
      const std::uint64_t full_end = std::min(issued, full);
      protocol::CommSignatures cs{c.id, c.nranks, {}};
      if (tp) {
        if (signed_calls < full_end) {
          cs.runs.push_back({signed_calls, full_end - signed_calls, "AllReduce", kBf16, kTpBytes / 2, 0, -1});
        }
      } else {
        for (std::uint64_t seq = signed_calls; seq < full_end; ++seq) {  // reduce-scatter, all-gather
          const bool rs = seq % 2 == 0;
          cs.runs.push_back({seq, 1, rs ? "ReduceScatter" : "AllGather", kBf16, dp_count, rs ? 0 : -1, -1});
        }
      }
      signed_calls = issued;
      if (!cs.runs.empty()) m.comms.push_back(std::move(cs));
      protocol::CommDigests cd{c.id, c.nranks, {}};
      block = std::max(block, full / kBlock);
      for (; issued > (block + 2) * kBlock; ++block) {
        protocol::SignatureBlock b{block * kBlock, kBlock, 0};
        for (std::uint64_t seq = b.seq; seq < b.seq + kBlock; ++seq) {
          const bool rs = seq % 2 == 0;
          b.digest += tp ? protocol::SignatureDigestTerm(seq, kFalconOpAllReduce, kBf16, kTpBytes / 2, 0, -1)
                         : protocol::SignatureDigestTerm(seq, rs ? kFalconOpReduceScatter : kFalconOpAllGather,
                                                         kBf16, dp_count, rs ? 0 : -1, -1);
        }
        cd.blocks.push_back(b);
      }
      if (!cd.blocks.empty()) m.digests.push_back(std::move(cd));
    }
    if (!m.comms.empty() || !m.digests.empty()) QueueReport(protocol::kSignaturesStream, protocol::ToJson(m), "call_signatures", node);
  }
}

}  // namespace falcon::sim
