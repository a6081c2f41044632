// SimAgents: the agents of a range of a simulated job's nodes, in one process, over one Redis
// connection — what `falcon-agent` would publish for their ranks and how it would answer the
// controller's commands, at the real agent's cadences and in the real protocol (docs/protocol.md).
//
// Per node and rank, on the agent's schedule (AgentCadence): every heartbeat the agent hash with
// its ranks' beats and a rank hash where it changed or its TTL is due (rank_beat.h), an
// `iterations` batch per rank per flush, `call_signatures` per rank per signature interval,
// `comm_profile` per rank per profile window while the controller asked for profile/sample mode,
// and an `alarm` (plus its `alert`) when the modelled detector sees the job's level change.
// Commands are read from every owned node's stream and the broadcast stream (each broadcast
// entry answered by every owned node) in one XREADGROUP per tick, and answered with modelled
// timings: a pause acks once each rank reaches its cut and holds the job's clock there until the
// resume (or the trap's deadline), a GEMM or P2P task after the time it would take on the
// modelled (possibly faulty) GPU or link.
// Thread-safety: one thread. Must never: block past a Redis call's timeout.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/sim/sim_job.h"
#include "daemon/protocol/messages.h"
#include "daemon/protocol/rank_beat.h"
#include "daemon/redis/redis_commands.h"
#include "daemon/redis/redis_connection.h"

namespace falcon::sim {

struct AgentCadence {
  int heartbeat_ms = 2000;
  int key_ttl_s = 10;
  int flush_ms = 500;
  int signature_ms = 200;  // 0: no call_signatures
  std::uint64_t signature_full_seqs = 4096;  // as the agent's: runs below, block digests past it
  int profile_ms = 10000;
  int detect_samples = 6;     // samples at a new level before the modelled detector alarms
  double alarm_threshold = 1.1;
  std::uint64_t stream_maxlen = 100000;
  bool broadcast = true;  // read falcon:{job}:broadcast and say so in the heartbeat, as the agent
};

// Modelled validation hardware.
struct DeviceModel {
  double gemm_tflops = 400;         // healthy dense throughput
  double intra_node_gbps = 150;     // NVLink, per direction
  double inter_node_gbps = 25;      // one NIC
  double latency_s = 20e-6;
};

// Latencies of a long run in bounded memory: the count and the maximum exact, and a uniform
// sample of at most `capacity` values (reservoir sampling, Vitter's algorithm R, with a fixed
// seed) for the quantiles. A day of 20 ticks a second is 1.7 million values, 14 MB kept whole.
class LatencySample {
 public:
  static constexpr std::size_t kCapacity = 65'536;
  explicit LatencySample(std::size_t capacity = kCapacity) : capacity_(std::max<std::size_t>(1, capacity)) {}
  void Add(double v);
  [[nodiscard]] std::uint64_t n() const { return n_; }
  [[nodiscard]] double max() const { return max_; }
  [[nodiscard]] const std::vector<double>& kept() const { return kept_; }

 private:
  std::size_t capacity_;
  std::uint64_t n_ = 0;
  double max_ = 0;
  std::vector<double> kept_;
  std::uint64_t rng_ = 0x9e3779b97f4a7c15ULL;  // xorshift64 state
};

struct SimCounters {
  std::map<std::string, std::uint64_t> messages;   // by type, what the agents wrote
  std::map<std::string, std::uint64_t> commands;   // by type, what they read
  std::uint64_t acks = 0;
  // Ranks whose pause the sim read after their cut had passed (a real agent would report
  // `missed`): the sim itself too far behind; the pause still traps them there.
  std::uint64_t late_traps = 0;
  std::uint64_t redis_commands = 0;                // sent by this process (pipelined included; a failed
                                                   // flush counts all it tried)
  std::uint64_t redis_errors = 0;
  // The sim's own latency, which every measured round trip includes and a real agent per node
  // would not add: per command, by type, how long it sat in its stream before the sim read it
  // (issued_ns to read), and how long its ack waited past its modelled due time.
  std::map<std::string, LatencySample> command_read_lag_ms, ack_lag_ms;
};

// {"n", "p50", "p99", "max"} of `v` (empty: n 0 only).
nlohmann::json LatencySummary(std::vector<double> v);
// The same of a LatencySample: n and max exact, the quantiles of its reservoir.
nlohmann::json LatencySummary(const LatencySample& s);

class SimAgents {
 public:
  // Owns nodes [first_node, end_node) of `job`. `worker` names the consumer.
  SimAgents(SimJob job, std::string job_name, std::int64_t first_node, std::int64_t end_node, int worker,
            AgentCadence cadence, DeviceModel device, std::unique_ptr<redis::RedisConnection> conn);

  // One tick at wall time now: publishes what is due, reads and answers commands. Unavailable
  // when Redis failed (the caller reconnects and goes on: nothing is lost but that tick's writes).
  [[nodiscard]] Status Tick(std::int64_t now_ns);
  // True once every owned rank has been registered at least once.
  bool registered() const { return registered_; }
  const SimCounters& counters() const { return counters_; }
  redis::RedisConnection& conn() { return *conn_; }
  SimJob& job() { return job_; }  // its clock, as these agents model it

 private:
  struct RankState {
    std::int64_t rank = 0;
    std::int64_t pid = 0;
    std::vector<SimComm> comms;
    std::string mode = "track";
    std::uint64_t next_sample = 0;        // first iteration sample not yet published
    std::uint64_t signed_tp = 0, signed_dp = 0;  // calls already in call_signatures
    std::uint64_t block_tp = 0, block_dp = 0;    // next digest block, once past the full seqs
    std::int64_t profile_since_ns = 0;
    bool slow = false;
    std::uint64_t level_run = 0;          // samples in a row on the other side of the verdict
    std::optional<std::uint64_t> level_onset;
    std::optional<std::int32_t> plan_delivered, plan_applied;
    protocol::RankKeyWriter key_writer;  // when its rank key is written, as an agent's
  };
  struct Pending {                        // an ack due at a modelled time
    std::int64_t due_ns = 0;
    protocol::Ack ack;
  };

  std::string Key(const protocol::KeySpec& spec, const std::string& host = {},
                  std::optional<std::int64_t> rank = std::nullopt) const;
  void Queue(std::vector<std::string> argv);
  // A report of `node`'s agent (node < 0: an entry of its own, as acks are).
  void QueueReport(const protocol::KeySpec& stream, const nlohmann::json& msg, const std::string& type,
                   std::int64_t node);
  void ClosePack();
  [[nodiscard]] Status Flush();
  // The node's ranks in ranks_ (they are contiguous), as [begin, end).
  using RankIt = std::map<std::int64_t, RankState>::iterator;
  std::pair<RankIt, RankIt> NodeRanks(std::int64_t node);
  // Each publishes what one node's agent would at its cadence.
  void Register(std::int64_t node, std::int64_t now_ns);
  void PublishIterations(std::int64_t node, std::int64_t now_ns);
  void Detect(RankState& r, std::uint64_t sample, std::int64_t now_ns);
  void PublishSignatures(std::int64_t node, std::int64_t now_ns);
  void PublishProfiles(std::int64_t node, std::int64_t now_ns);
  // Reads the commands and handles them at the moment the read returned (not the tick's start: a
  // command the controller issued during the tick's publishing would read with a negative lag,
  // and its modelled ack be due early).
  [[nodiscard]] Status ReadCommands(std::int64_t now_ns);
  // The wall clock now, never before `not_before_ns` (the tick's own time).
  static std::int64_t ClockNs(std::int64_t not_before_ns);
  void Handle(const std::string& host, const protocol::Command& c, std::int64_t now_ns);
  void SendDueAcks(std::int64_t now_ns);
  std::vector<RankState*> Targets(const std::string& host, const protocol::Command& c);
  protocol::ReportHeader Header(std::int64_t node, std::int64_t now_ns) const;
  // Calls issued on a communicator of kind tp/dp by wall time t (fraction of the iteration).
  std::uint64_t IssuedCalls(const SimComm& c, std::int64_t rank, std::int64_t t_ns);
  double GemmSeconds(std::int64_t rank, std::int64_t size, std::int64_t now_ns) const;
  double P2pSeconds(std::int64_t rank, std::int64_t peer, std::int64_t bytes, std::int64_t now_ns) const;
  std::optional<std::int64_t> VcommPeer(const std::string& blob, std::int64_t vrank);
  std::string VcommKey() const;
  // The pause's hold of the job clock: a pause holds it at its cut until the trap's deadline; the
  // first resume any worker process reads sets the time every process resumes the job at
  // (HoldsKey), so that all of them keep one clock.
  void HoldAtCut(const protocol::Command& pause, std::uint64_t k);
  void ReleaseHold(std::int64_t now_ns);
  std::string HoldsKey() const;
  // A communicator's call signatures in a profile window: (op, bytes, peer).
  struct Signature {
    std::string op;
    std::uint64_t bytes = 0;
    std::int32_t peer = -1;
  };
  static std::vector<Signature> ProfileSignatures(const SimComm& c);
  // Device time of one call as the rank's CUDA events would see it: the transfer, plus the time
  // spent waiting for the slowest member (a compute straggler's peers wait; it waits least).
  double CallMicros(std::int64_t rank, const SimComm& c, const Signature& sig, std::int64_t now_ns) const;

  SimJob job_;
  const std::string job_name_;
  const std::int64_t first_node_, end_node_;
  const std::string consumer_;
  const AgentCadence cadence_;
  const DeviceModel device_;
  std::unique_ptr<redis::RedisConnection> conn_;

  std::map<std::int64_t, RankState> ranks_;              // by global rank
  std::map<std::string, std::int64_t> node_of_host_;
  std::vector<std::vector<std::string>> queue_;          // commands to pipeline
  redis::FieldList pack_;                                // the open packed entry
  std::string pack_key_;
  std::int64_t pack_node_ = -1;
  std::size_t pack_bytes_ = 0;
  std::vector<Pending> pending_;
  struct Vcomm {  // a rank's validation communicator, from vcomm_join
    std::string blob;
    std::int64_t vrank = 0, vranks = 0;
  };
  std::map<std::int64_t, Vcomm> vcomm_;  // by rank
  std::map<std::string, std::map<std::int64_t, std::int64_t>> vcomm_members_;  // blob -> vrank -> rank
  struct OpenHold {  // a pause holding the job clock that no resume has released yet
    std::uint64_t iteration = 0;
    std::int64_t deadline_ns = 0;
  };
  std::optional<OpenHold> hold_;
  // When each node's agent next heartbeats, flushes its iterations (and profile windows) and its
  // call signatures. Real agents start at different moments, so each keeps its own phase: the
  // nodes publish spread over each cadence, not all in one tick (a tick that published a
  // 16,384-rank job at once took up to 0.9 s, and every command waited for it).
  struct NodeDue {
    std::int64_t heartbeat_ns = 0, flush_ns = 0, signature_ns = 0;
  };
  std::vector<NodeDue> due_;  // by node - first_node_; 0: at the first tick
  bool groups_made_ = false;
  bool registered_ = false;
  SimCounters counters_;
};

}  // namespace falcon::sim
