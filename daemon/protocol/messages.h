// Typed protocol messages and their JSON forms (include/falcon/protocol.h is the schema).
//
// Writers fill a struct and call ToJson; nothing else in Falcon assembles protocol JSON. Readers
// get structs only through Parse* functions, which validate first (validate.h): a struct that
// came from Redis has passed its schema. A unit test checks that every ToJson output validates
// against its own spec.
// Thread-safety: value types and pure functions. Must never: throw.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "analyzer/cut_plan.h"
#include "falcon/protocol.h"
#include "falcon/status.h"

namespace falcon::protocol {

// Fields shared by every agent report.
struct ReportHeader {
  std::string job;
  std::string host;
  std::int64_t at_ns = 0;  // wall clock
  bool operator==(const ReportHeader&) const = default;
};

struct CommSummary {
  std::uint64_t id = 0;
  std::int32_t rank = -1;
  std::int32_t nranks = 0;
  std::string name;
  // Calls of this communicator the rank has issued so far (the comm_seq its next call takes);
  // the controller picks pause cuts from it.
  std::uint64_t calls = 0;
  bool operator==(const CommSummary&) const = default;
};

struct RankRegistration {
  ReportHeader header;
  std::int64_t rank = -1;
  std::int64_t pid = 0;
  std::int64_t local_rank = -1;
  std::string exe;
  std::string state = "live";  // live | exited | orphaned
  std::int64_t started_ns = 0;
  std::string mode = "track";
  std::vector<CommSummary> comms;
  std::uint64_t records = 0;
  std::uint64_t lost = 0;
  std::optional<std::uint64_t> period;
  std::uint64_t iterations = 0;
  bool slow = false;
  // The mitigation plan in the process's shared memory and the framework's answers
  // (falconAckPlan: highest version applied / rejected); absent while none.
  std::optional<std::uint32_t> plan_delivered, plan_applied, plan_rejected;
  // What applying S2, S3, S4 costs this rank in seconds, as its framework reported it
  // (falconReportCost); absent while not reported.
  std::optional<double> cost_s2, cost_s3, cost_s4, cost_s5;  // cost_s5: the pipeline plan (strategy 5)
  // The framework's phase (falconSetPhase) when not training, and the iterations left out of
  // detection because they overlapped a phase or a validation pause.
  std::optional<std::string> phase;
  std::uint64_t excluded = 0;
  bool operator==(const RankRegistration&) const = default;
};

// One rank's counters in an agent heartbeat (kRankBeatFields): what changes every heartbeat, so
// that the rank key is written only when the rest of it changes (rank_beat.h).
struct RankBeat {
  std::int64_t rank = -1;
  std::int64_t written_ns = 0;      // at_ns of the rank key's content these counters go with
  std::vector<std::uint64_t> calls;  // per communicator, in the rank key's comms order
  std::uint64_t records = 0;
  std::uint64_t lost = 0;
  std::uint64_t iterations = 0;
  std::uint64_t excluded = 0;
};

struct AgentHeartbeat {
  ReportHeader header;
  std::int64_t pid = 0;
  std::string version;
  std::int64_t started_ns = 0;
  std::vector<std::int64_t> ranks;
  double cpu_seconds = 0;
  std::uint64_t outbox = 0;
  std::uint64_t dropped = 0;
  bool broadcast = false;  // reads kBroadcastStream (written only when true)
  std::optional<std::vector<RankBeat>> beats;  // absent: the rank keys carry current counters
};

struct IterationBatch {
  ReportHeader header;
  std::int64_t rank = -1;
  std::int64_t pid = 0;
  std::uint64_t period = 0;
  std::uint64_t first = 0;
  std::vector<std::int64_t> start_ns;  // same length as seconds
  std::vector<double> seconds;
};

struct AlarmReport {
  ReportHeader header;
  std::int64_t rank = -1;
  std::int64_t pid = 0;
  std::string kind;  // slow | recovered
  std::uint64_t onset = 0;
  std::uint64_t at = 0;
  std::optional<std::int64_t> onset_ns;
  double ratio = 1;
  double probability = 0;
  double level_s = 0;
  double baseline_s = 0;
};

// A rank that stopped making progress with work outstanding in NCCL, or that resumed
// (daemon/agent/stall_watch.h).
struct StallReport {
  ReportHeader header;
  std::int64_t rank = -1;
  std::int64_t pid = 0;
  std::string kind;  // stalled | progressing
  double age_s = 0;
  double bound_s = 0;
  std::optional<std::int64_t> last_call_ns;  // wall clock
  std::optional<std::string> comm;           // stalled: 16 hex digits
  std::optional<std::uint64_t> seq;
  std::optional<std::string> op;
  std::optional<bool> in_call;
};

// call_signatures: one rank's newly issued collectives, as runs of alike consecutive calls.
struct SignatureRun {
  std::uint64_t seq = 0;  // comm_seq of the first call
  std::uint64_t n = 1;
  std::string op;
  std::int32_t dtype = 255;
  std::uint64_t count = 0;
  std::int32_t redop = -1;
  std::int32_t root = -1;
};

struct CommSignatures {
  std::uint64_t id = 0;
  std::int32_t nranks = 0;
  std::vector<SignatureRun> runs;
};

// A block of kSignatureBlockCalls comm_seqs, sent as one digest (protocol.h).
struct SignatureBlock {
  std::uint64_t seq = 0;  // the block's first comm_seq
  std::uint64_t n = 0;    // collectives issued in it
  std::uint64_t digest = 0;
};

struct CommDigests {
  std::uint64_t id = 0;
  std::int32_t nranks = 0;
  std::vector<SignatureBlock> blocks;
};

struct CallSignatures {
  ReportHeader header;
  std::int64_t rank = -1;
  std::int64_t pid = 0;
  std::vector<CommSignatures> comms;
  std::optional<std::uint64_t> dropped;
  std::vector<CommDigests> digests;  // written only when not empty
};

// One collective's term of its block's digest: a block's digest is the sum (mod 2^64) of its
// calls' terms, so it does not depend on the order the calls' records were read in. `op` is the
// FalconOp code (shm_abi.h); the other arguments as in SignatureRun.
std::uint64_t SignatureDigestTerm(std::uint64_t seq, std::uint8_t op, std::int32_t dtype, std::uint64_t count,
                                  std::int32_t redop, std::int32_t root);

struct SignatureProfile {
  std::string op;
  std::uint64_t bytes = 0;
  std::int32_t peer = -1;
  std::uint64_t count = 0;
  std::optional<double> mean_us;    // only for timed calls (profile/sample)
  std::optional<double> median_us;
  std::optional<std::string> clock; // "device" (CUDA events) or "host", with the times
};

struct CommProfile {
  std::uint64_t id = 0;
  std::int32_t rank = -1;
  std::int32_t nranks = 0;
  std::vector<SignatureProfile> sigs;
};

struct CommProfileReport {
  ReportHeader header;
  std::int64_t rank = -1;
  std::int64_t pid = 0;
  std::int64_t since_ns = 0;
  std::string mode = "track";
  std::vector<CommProfile> comms;
};

// A controller command, validated. Which fields mean something depends on `type`.
struct Command {
  std::string type;  // set_mode | pause | resume | validate | plan | cut_info | progress
  std::string id;
  std::int64_t issued_ns = 0;
  std::optional<std::int64_t> deadline_ns;
  std::optional<std::vector<std::int64_t>> ranks;  // absent: all ranks of the agent
  // set_mode
  std::string mode;
  std::uint32_t sample_every = 100;
  // pause
  std::uint64_t at_iteration = 0;
  double max_pause_s = 0;
  std::optional<std::uint64_t> comm_seq;  // with comm: the cut
  struct RankTargets {
    std::int64_t rank = -1;
    std::vector<analyzer::CutTarget> targets;  // 1..FALCON_PAUSE_MAX_TARGETS
  };
  std::vector<RankTargets> targets;  // the consistent cut per rank (instead of comm/comm_seq)
  // pause, validate
  std::string task;
  std::optional<std::string> comm;
  std::optional<std::int64_t> peer, shift, bytes, size, repeats;
  std::optional<std::string> dtype;            // gemm: fp32 | bf16 | fp16 (absent: fp32)
  std::optional<std::string> blob;             // vcomm_join: 256 hex digits
  std::optional<std::int64_t> vranks, vrank;   // vcomm_join
  // Per target rank, in the order of `ranks` (empty: absent): p2p peers instead of `peer`,
  // vcomm_join validation ranks instead of `vrank`.
  std::vector<std::int64_t> peers, vrank_each;
  // plan (elements range-checked by ParseCommand)
  std::int32_t plan_version = 0;
  std::string strategy;                      // S1 | S2 | S3 | S4 | pipeline
  std::vector<std::int32_t> micro_batches;   // per DP replica, each 1..4096; empty: none
  std::vector<std::int32_t> placement;       // node of every global rank, 0..65535; empty: none
  std::vector<std::int32_t> exclude_nodes;
  std::vector<std::int32_t> warmup;          // pipeline: warm-up forwards per stage; empty: none
  bool restart = false;
  // progress: latest calls per communicator to include
  std::optional<std::int64_t> calls;
};

// One rank's part of a pause / resume / validate / plan ack.
struct AckRankResult {
  std::int64_t rank = -1;
  // trap: armed | trapped | missed | expired | timed_out | resumed | rejected | idle | failed | ok
  // plan: delivered | stale (already holds this version or newer) | failed
  std::string state;
  std::optional<std::string> task_status;  // validate: ok | bad_request | unsupported | failed
  std::optional<double> median_s, min_s, max_s, rate;
  std::optional<std::string> blob;  // vcomm_id: the validation communicator's unique id, hex
  std::optional<nlohmann::json> pattern;  // cut_info: CutPatternToJson
  std::optional<std::string> dtype;  // validate gemm: the element type that ran
  std::optional<nlohmann::json> progress;  // progress: the rank in the falcon-progress format
};

// cut_info's per-rank answer: one period of calls (analyzer::RankCallPattern, min_position
// unset), the units issued since its start, their pace and the age of the last call.
struct CutPatternMessage {
  analyzer::RankCallPattern pattern;
  std::uint64_t position = 0;
  double units_per_s = 0;
  double age_s = 0;
};
nlohmann::json CutPatternToJson(const CutPatternMessage& m);
// Validates every field (bounds, indices, sizes); InvalidArgument says which.
Result<CutPatternMessage> ParseCutPattern(const nlohmann::json& j);
nlohmann::json CutTargetsToJson(const Command::RankTargets& t);

struct Ack {
  ReportHeader header;
  std::string command;
  std::string command_type;
  std::string status;  // ok | unsupported | rejected | failed | expired
  std::string detail;
  std::vector<std::int64_t> ranks;
  std::vector<AckRankResult> results;  // absent from the JSON when empty
};

struct Alert {
  std::string job;
  std::int64_t at_ns = 0;
  std::string severity;  // info | warning | critical
  std::string source;    // agent | controller
  std::string summary;
  std::optional<std::string> host;
  std::optional<std::int64_t> rank;
  std::optional<std::string> incident;
};

nlohmann::json ToJson(const RankRegistration& m);
nlohmann::json ToJson(const AgentHeartbeat& m);
nlohmann::json ToJson(const IterationBatch& m);
nlohmann::json ToJson(const AlarmReport& m);
nlohmann::json ToJson(const StallReport& m);
nlohmann::json ToJson(const CallSignatures& m);
// The text of ToJson(m).dump(), byte for byte, written without building the JSON tree:
// call_signatures is the agent's busiest message (one run per call when no two neighbouring
// collectives are alike), and building and freeing the tree cost more than all else the agent
// does per call. Throws as dump() does (nlohmann::json::type_error on a header string that is
// not UTF-8).
std::string Dump(const CallSignatures& m);
nlohmann::json ToJson(const CommProfileReport& m);
nlohmann::json ToJson(const Command& m);  // for the controller and tests
nlohmann::json ToJson(const Ack& m);
nlohmann::json ToJson(const Alert& m);

// Copies a plan's fields (micro_batches, placement, exclude_nodes, warmup, restart — those present) from
// a plan object (the controller's decision, or a mitigation_plan message) into a plan command.
// REQUIRES: the fields present have their schema types (arrays of integers, a boolean).
void CopyPlanFields(const nlohmann::json& plan, Command* c);

// Validates `text` as any command type and extracts it.
[[nodiscard]] Result<Command> ParseCommand(std::string_view text);

// A validate command's p2p peer and vcomm_join validation rank for `rank`: its entry of `peers` /
// `vrank_each` (paired with `ranks` by position, as ParseCommand checked), else the single-rank
// `peer` / `vrank`; nullopt when neither names one for it.
[[nodiscard]] std::optional<std::int64_t> PeerOf(const Command& c, std::int64_t rank);
[[nodiscard]] std::optional<std::int64_t> VrankOf(const Command& c, std::int64_t rank);

// What can still be told about a command that failed ParseCommand, so that its sender gets a
// "rejected" ack instead of silence: its id and type, when `text` is a JSON object whose "id" is
// a string of 1..64 characters and whose "type" is a known command type. nullopt otherwise.
struct CommandIdentity {
  std::string id;
  std::string type;
};
std::optional<CommandIdentity> SalvageCommandIdentity(std::string_view text);

// `text` made to fit a text field of at most `max_bytes` bytes (kMaxText for summaries): as is
// when it fits, else its start, cut on a UTF-8 character boundary, then " ... (N bytes, cut)".
// REQUIRES: max_bytes >= 64.
std::string FitText(std::string text, std::size_t max_bytes);

// 16 lower-case hex digits, and back (nullopt unless exactly 16 hex digits).
std::string CommIdHex(std::uint64_t id);
std::optional<std::uint64_t> ParseCommIdHex(std::string_view hex);

}  // namespace falcon::protocol
