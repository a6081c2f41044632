// Falcon's Redis protocol: every key, stream and channel Falcon uses and every message that
// travels through them, declared once as data (STYLE.md rule 10). docs/protocol.md is the
// reader's guide; this header is the contract.
//
// Names are patterns over a small set of variables, all namespaced by job:
//   {job}  the job name (FALCON_JOB / agent config `job`)   {host}  the agent's node name
//   {rank} a global rank (decimal)
// A variable's value must be 1..128 characters of [A-Za-z0-9._-] (no ':', braces or spaces), so
// a key names exactly one thing. {job} is written with its braces ("falcon:{train1}:rank:3"): it
// is the Redis Cluster hash tag, so one job's keys share one hash slot (one cluster node). {host}
// and {rank} are replaced bare. Build keys with falcon::protocol::FormatKey (daemon/protocol/).
//
// Payloads are JSON objects. Every message carries "v" (kSchemaVersion) and "type" (one of the
// MessageSpec types below); fields not listed are ignored by readers (a newer minor writer may add
// them), listed fields must have the declared JSON type and, where given, lie in the declared
// choices or bounds. Readers validate every message before use and log and drop the bad ones;
// nothing taken from Redis is ever used as a handle, pointer, path or code.
// Stream entries hold one field, kPayloadField ("msg"), whose value is the JSON text; hashes hold
// the same field plus plain mirror fields for people reading with redis-cli.
//
// Thread-safety: constants only. Standard library only (no hiredis, Boost or JSON types here).
// Must never: hold mutable state, or change a name or field meaning without bumping kSchemaVersion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

namespace falcon::protocol {

// 2: the job became the keys' hash tag (falcon:{job}:...; 1 wrote falcon:job:...).
inline constexpr int kSchemaVersion = 2;
inline constexpr std::string_view kPayloadField = "msg";  // stream entry / hash field with JSON
// An agent packs the reports of one flush for one stream (iterations, alarms, profiles,
// signatures) into one entry, one kPayloadField each, at most this many and this large
// together; readers take every kPayloadField of an entry, in order.
inline constexpr std::size_t kPackMessages = 64;
inline constexpr std::size_t kPackBytes = 512 * 1024;
// A report stream keeps about `max_messages` messages (0: unbounded): an entry of `messages`
// messages is added with MAXLEN ~ max_messages / messages (at least 1), so packing does not
// multiply what a stream holds.
constexpr std::uint64_t EntryCap(std::uint64_t max_messages, std::size_t messages) {
  if (max_messages == 0) return 0;
  const std::uint64_t per = messages == 0 ? 1 : messages;
  return (max_messages + per - 1) / per;
}
// An agent's consumer group on the commands it reads, its own stream and the broadcast stream:
// kCommandGroup + ":" + host (CommandGroup). Each agent needs a group of its own on the broadcast
// stream, since a group hands an entry to one consumer only, and XREADGROUP reads every stream it
// names through one group.
inline constexpr std::string_view kCommandGroup = "falcon-agent";
inline std::string CommandGroup(std::string_view host) {
  std::string g(kCommandGroup);
  g += ':';
  g += host;
  return g;
}

// ---- Keys, streams, channels ------------------------------------------------------------------

enum class KeyKind : std::uint8_t { kStream, kHash, kChannel };
enum class Direction : std::uint8_t { kAgentToController, kControllerToAgent, kControllerToAll };

struct KeySpec {
  std::string_view name;      // short name used in docs, logs and FindKey()
  std::string_view pattern;   // with {job}, {host}, {rank}
  KeyKind kind;
  Direction direction;
  std::string_view messages;  // message type(s) it holds, '|'-separated
  std::string_view meaning;
};

inline constexpr KeySpec kRankKey{
    "rank", "falcon:{job}:rank:{rank}", KeyKind::kHash, Direction::kAgentToController,
    "rank_register",
    "one traced rank: identity and communicators; written when they change and rewritten unchanged "
    "to renew its TTL (its counters as of that write: the current ones are its beat in the agent "
    "key), expires (TTL) when its agent stops refreshing it"};
inline constexpr KeySpec kAgentKey{
    "agent", "falcon:{job}:agent:{host}", KeyKind::kHash, Direction::kAgentToController,
    "agent_heartbeat",
    "one agent: liveness, ranks followed, each rank's counters (beats), every heartbeat; expires (TTL)"};
inline constexpr KeySpec kIterationsStream{
    "iterations", "falcon:{job}:iterations", KeyKind::kStream, Direction::kAgentToController,
    "iterations", "iteration-time samples, batched per rank (MAXLEN ~)"};
inline constexpr KeySpec kAlarmsStream{
    "alarms", "falcon:{job}:alarms", KeyKind::kStream, Direction::kAgentToController, "alarm",
    "detector alarms per rank: slow / recovered"};
inline constexpr KeySpec kProfilesStream{
    "profiles", "falcon:{job}:profiles", KeyKind::kStream, Direction::kAgentToController,
    "comm_profile", "per-communicator call profiles per rank (op/size signature, count, timing)"};
inline constexpr KeySpec kCommandsStream{
    "commands", "falcon:{job}:commands:{host}", KeyKind::kStream, Direction::kControllerToAgent,
    "set_mode|pause|resume|validate|plan|cut_info|progress",
    "commands for one agent; read with XREADGROUP (group CommandGroup(host)), acknowledged with "
    "XACK after an ack message is queued"};
inline constexpr KeySpec kBroadcastStream{
    "broadcast", "falcon:{job}:broadcast", KeyKind::kStream, Direction::kControllerToAgent,
    "set_mode|resume|validate|cut_info",
    "commands for every agent at once (one entry, not one per host): each agent reads it beside "
    "its own stream, in its own group (CommandGroup(host)), and acks as for its own commands"};
inline constexpr KeySpec kAcksStream{
    "acks", "falcon:{job}:acks", KeyKind::kStream, Direction::kAgentToController, "ack",
    "one ack per command and agent"};
inline constexpr KeySpec kIncidentsStream{
    "incidents", "falcon:{job}:incidents", KeyKind::kStream, Direction::kControllerToAll,
    "incident", "detection, localisation, decision, resolution: the durable record of alerts"};
inline constexpr KeySpec kAlertsChannel{
    "alerts", "falcon:{job}:alerts", KeyKind::kChannel, Direction::kControllerToAll, "alert",
    "live alerts (pub/sub; lost while nobody subscribes: read incidents for history)"};

inline constexpr KeySpec kControllerKey{
    "controller", "falcon:{job}:controller", KeyKind::kHash, Direction::kControllerToAll,
    "controller_state",
    "the controller's state (tracking, profiling, validating), open incident and stream cursors; "
    "written at every transition and heartbeat, read back when a controller (re)starts"};
// The controller hash's field with the ranks whose last alarm said slow, {rank: {ratio, level_s,
// baseline_s, onset_ns}}: written beside kPayloadField, only when an alarm changed them.
inline constexpr std::string_view kControllerSlowField = "slow";

inline constexpr KeySpec kRequestsStream{
    "requests", "falcon:{job}:requests", KeyKind::kStream, Direction::kAgentToController,
    "controller_request",
    "requests to the controller from people and tools (falcon-ctl validate): a validation round now"};

inline constexpr KeySpec kPlanKey{
    "plan", "falcon:{job}:plan", KeyKind::kHash, Direction::kControllerToAll, "mitigation_plan",
    "the mitigation plan in force (latest decision): what falcon-ctl plan shows; in act mode also "
    "sent to every agent as a plan command"};

inline constexpr KeySpec kStallsStream{
    "stalls", "falcon:{job}:stalls", KeyKind::kStream, Direction::kAgentToController, "stall",
    "ranks that stopped making progress with work outstanding in NCCL, and their recovery "
    "(docs/hangs.md)"};

inline constexpr KeySpec kSignaturesStream{
    "signatures", "falcon:{job}:signatures", KeyKind::kStream, Direction::kAgentToController,
    "call_signatures",
    "each rank's collectives as they are issued (communicator, seq, op, datatype, count, "
    "reduction, root), compared across members to raise mismatches (docs/hangs.md)"};

inline constexpr KeySpec kAllKeys[] = {kRankKey,        kAgentKey,        kIterationsStream,
                                       kAlarmsStream,   kProfilesStream,  kCommandsStream,
                                       kBroadcastStream,
                                       kAcksStream,     kIncidentsStream, kAlertsChannel,
                                       kControllerKey,  kRequestsStream,  kPlanKey,
                                       kStallsStream,   kSignaturesStream};

// ---- Messages -----------------------------------------------------------------------------------

enum class JsonType : std::uint8_t { kString, kInteger, kNumber, kBoolean, kObject, kArray };

struct ObjectSpec;  // the fields of an array's object elements, below

struct FieldSpec {
  std::string_view name;
  JsonType type;
  bool required;
  std::string_view meaning;
  // kString: '|'-separated allowed values ("" = any string of 0..max characters).
  std::string_view choices = {};
  // kInteger/kNumber: inclusive bounds; kString/kArray: max length in characters/elements.
  double min = std::numeric_limits<double>::lowest();
  double max = std::numeric_limits<double>::max();
  JsonType items = JsonType::kObject;  // kArray: element type
  // kArray of kInteger/kNumber: inclusive bounds of every element.
  double item_min = std::numeric_limits<double>::lowest();
  double item_max = std::numeric_limits<double>::max();
  // kArray of kObject: the elements' fields, checked like a message's (nullptr: any object).
  const ObjectSpec* item_object = nullptr;
};

struct ObjectSpec {
  std::span<const FieldSpec> fields;
};

struct MessageSpec {
  std::string_view type;
  std::span<const FieldSpec> fields;  // besides "v" and "type"
  std::string_view meaning;
};

inline constexpr double kMaxI64 = 9.2e18;
inline constexpr double kMaxRank = 16777216;  // 2^24 ranks
inline constexpr double kMaxText = 4096;
inline constexpr double kLowest = std::numeric_limits<double>::lowest();
inline constexpr double kHighest = std::numeric_limits<double>::max();
// Members of one communicator. A size the controller allocates from (JobView), so it is bounded
// well above today's largest jobs rather than by what an int32 holds.
inline constexpr double kMaxCommRanks = 1 << 20;
// Communicators one rank may report; real processes hold tens.
inline constexpr double kMaxCommsPerRank = 1024;
// Seconds: iteration times, benchmark times, costs. The controller's own state holds some of
// them (current_s, healthy_s) under the same bound.
inline constexpr double kMaxSeconds = 1e9;

// One communicator of a rank_register.
inline constexpr FieldSpec kRankCommFields[] = {
    {"id", JsonType::kString, true, "communicator id, 16 hex digits", "", 16, 16},
    {"rank", JsonType::kInteger, true, "the rank's rank in it", "", 0, kMaxCommRanks - 1},
    {"nranks", JsonType::kInteger, true, "its members", "", 1, kMaxCommRanks},
    {"name", JsonType::kString, false, "its name (ncclConfig_t commName)", "", 0, 128},
    {"calls", JsonType::kInteger, false, "calls made on it so far", "", 0, kMaxI64},
};
inline constexpr ObjectSpec kRankCommObject{kRankCommFields};

// One call signature of a comm_profile communicator.
inline constexpr FieldSpec kProfileSigFields[] = {
    {"op", JsonType::kString, true, "operation", "", 1, 64},
    {"bytes", JsonType::kInteger, true, "bytes per call", "", 0, kMaxI64},
    {"peer", JsonType::kInteger, true, "peer or root, -1 if none", "", -1, kMaxCommRanks},
    {"count", JsonType::kInteger, true, "calls in the window", "", 0, kMaxI64},
    {"mean_us", JsonType::kNumber, false, "mean time per call, us", "", 0, kMaxSeconds * 1e6},
    {"median_us", JsonType::kNumber, false, "median time per call, us", "", 0, kMaxSeconds * 1e6},
    {"clock", JsonType::kString, false, "what the times measure", "device|host"},
};
inline constexpr ObjectSpec kProfileSigObject{kProfileSigFields};

// One communicator of a comm_profile.
inline constexpr FieldSpec kProfileCommFields[] = {
    {"id", JsonType::kString, true, "communicator id, 16 hex digits", "", 16, 16},
    {"rank", JsonType::kInteger, true, "the rank's rank in it", "", 0, kMaxCommRanks - 1},
    {"nranks", JsonType::kInteger, true, "its members", "", 1, kMaxCommRanks},
    {"sigs", JsonType::kArray, true, "call signatures", "", 0, 65536, JsonType::kObject, kLowest, kHighest,
     &kProfileSigObject},
};
inline constexpr ObjectSpec kProfileCommObject{kProfileCommFields};

// One rank's result in an ack (other fields: blob, pattern, checked by their readers).
inline constexpr FieldSpec kAckResultFields[] = {
    {"rank", JsonType::kInteger, true, "global rank", "", -1, kMaxRank},
    {"state", JsonType::kString, false, "the rank's pause state", "", 0, 64},
    {"task_status", JsonType::kString, false, "validate: the task's outcome", "", 0, 64},
    {"median_s", JsonType::kNumber, false, "validate: median time, s", "", 0, kMaxSeconds},
    {"min_s", JsonType::kNumber, false, "validate: fastest time, s", "", 0, kMaxSeconds},
    {"max_s", JsonType::kNumber, false, "validate: slowest time, s", "", 0, kMaxSeconds},
    {"rate", JsonType::kNumber, false, "validate: achieved rate (FLOP/s or B/s)", "", 0, 1e18},
    {"dtype", JsonType::kString, false, "validate gemm: the element type that ran", "fp32|bf16|fp16"},
};
inline constexpr ObjectSpec kAckResultObject{kAckResultFields};

// Fields every agent report carries.
#define FALCON_PROTOCOL_REPORT_FIELDS                                                         \
  {"job", JsonType::kString, true, "job name", "", 1, 128},                                    \
      {"host", JsonType::kString, true, "agent's node name", "", 1, 128},                      \
      {"at_ns", JsonType::kInteger, true, "wall-clock time of the report, ns since epoch", "", \
       0, kMaxI64}

#define FALCON_PROTOCOL_RANK_FIELDS                                                          \
  {"rank", JsonType::kInteger, true, "global rank (-1 if unknown)", "", -1, kMaxRank},       \
      {"pid", JsonType::kInteger, true, "process id in the rank's own PID namespace (its container's)", "", 1, 4194304}

inline constexpr FieldSpec kRankRegisterFields[] = {
    FALCON_PROTOCOL_REPORT_FIELDS,
    FALCON_PROTOCOL_RANK_FIELDS,
    {"local_rank", JsonType::kInteger, false, "rank on the node", "", -1, kMaxRank},
    {"exe", JsonType::kString, false, "program name", "", 0, 128},
    {"state", JsonType::kString, true, "process state", "live|exited|orphaned"},
    {"started_ns", JsonType::kInteger, true, "segment creation, wall ns", "", 0, kMaxI64},
    {"mode", JsonType::kString, true, "shim recording mode now", "track|profile|sample|off"},
    {"comms", JsonType::kArray, true, "communicators: {id: 16 hex digits, rank, nranks, name, calls}", "", 0,
     kMaxCommsPerRank, JsonType::kObject, kLowest, kHighest, &kRankCommObject},
    {"records", JsonType::kInteger, true, "call records read so far", "", 0, kMaxI64},
    {"lost", JsonType::kInteger, true, "records the shim overwrote before they were read", "", 0,
     kMaxI64},
    {"period", JsonType::kInteger, false, "calls per iteration (absent until locked)", "", 1,
     kMaxI64},
    {"iterations", JsonType::kInteger, true, "iteration samples so far", "", 0, kMaxI64},
    {"slow", JsonType::kBoolean, true, "the detector's current verdict"},
    {"plan_delivered", JsonType::kInteger, false,
     "version of the mitigation plan in the process's shared memory (absent: none)", "", 1,
     2147483647},
    {"plan_applied", JsonType::kInteger, false,
     "highest plan version the framework acked as applied (falconAckPlan status 0)", "", 1,
     2147483647},
    {"plan_rejected", JsonType::kInteger, false,
     "highest plan version the framework acked as rejected (falconAckPlan status != 0)", "", 1,
     2147483647},
    {"cost_s2", JsonType::kNumber, false,
     "seconds of training applying S2 costs this rank, as its framework measured (falconReportCost)", "", 0,
     4233600},
    {"cost_s3", JsonType::kNumber, false, "the same for S3 (stop, state move, communicator rebuild)", "", 0,
     4233600},
    {"cost_s4", JsonType::kNumber, false, "the same for S4 (checkpoint, relaunch, load, warm-up)", "", 0,
     4233600},
    {"cost_s5", JsonType::kNumber, false, "the same for the pipeline plan (strategy 5: the switch of warm-up counts)",
     "", 0, 4233600},
    {"phase", JsonType::kString, false,
     "the phase the framework annotated (falconSetPhase); absent: training",
     "train|checkpoint|eval|dataload|other"},
    {"excluded", JsonType::kInteger, false,
     "iterations left out of detection because they overlapped a phase or a validation pause", "", 0,
     kMaxI64},
};
inline constexpr MessageSpec kRankRegister{"rank_register", kRankRegisterFields,
                                           "rank registration and heartbeat (kRankKey)"};

// One rank's beat in an agent_heartbeat: the counters that change every heartbeat, kept out of the
// rank key so that the key is written only when its content changes.
inline constexpr FieldSpec kRankBeatFields[] = {
    {"rank", JsonType::kInteger, true, "global rank", "", 0, kMaxRank},
    {"written_ns", JsonType::kInteger, true,
     "at_ns of the rank key's content these counters go with (a reader holding another one re-reads the key)",
     "", 0, kMaxI64},
    {"calls", JsonType::kArray, true, "calls made so far per communicator, in the rank key's comms order", "", 0,
     kMaxCommsPerRank, JsonType::kInteger, 0, kMaxI64},
    {"records", JsonType::kInteger, true, "call records read so far", "", 0, kMaxI64},
    {"lost", JsonType::kInteger, true, "records the shim overwrote before they were read", "", 0, kMaxI64},
    {"iterations", JsonType::kInteger, true, "iteration samples so far", "", 0, kMaxI64},
    {"excluded", JsonType::kInteger, false, "iterations left out of detection", "", 0, kMaxI64},
};
inline constexpr ObjectSpec kRankBeatObject{kRankBeatFields};

inline constexpr FieldSpec kAgentHeartbeatFields[] = {
    FALCON_PROTOCOL_REPORT_FIELDS,
    {"pid", JsonType::kInteger, true, "agent pid", "", 1, 4194304},
    {"version", JsonType::kString, true, "agent version", "", 1, 64},
    {"started_ns", JsonType::kInteger, true, "agent start, wall ns", "", 0, kMaxI64},
    {"ranks", JsonType::kArray, true, "ranks followed", "", 0, kMaxRank, JsonType::kInteger, -1, kMaxRank},
    {"cpu_seconds", JsonType::kNumber, true, "agent CPU time (user + system)", "", 0, 1e12},
    {"outbox", JsonType::kInteger, true, "messages waiting for Redis", "", 0, kMaxI64},
    {"dropped", JsonType::kInteger, true, "messages dropped from a full outbox", "", 0, kMaxI64},
    {"broadcast", JsonType::kBoolean, false,
     "reads the broadcast command stream (kBroadcastStream); absent: its own stream only"},
    {"beats", JsonType::kArray, false,
     "per rank followed: {rank, written_ns, calls, records, lost, iterations, excluded?}, the rank key's "
     "counters now (absent: the rank keys hold current counters)",
     "", 0, kMaxRank, JsonType::kObject, kLowest, kHighest, &kRankBeatObject},
};
inline constexpr MessageSpec kAgentHeartbeat{"agent_heartbeat", kAgentHeartbeatFields,
                                             "agent liveness (kAgentKey)"};

inline constexpr FieldSpec kIterationsFields[] = {
    FALCON_PROTOCOL_REPORT_FIELDS,
    FALCON_PROTOCOL_RANK_FIELDS,
    {"period", JsonType::kInteger, true, "calls per iteration of the current lock", "", 1,
     kMaxI64},
    {"first", JsonType::kInteger, true, "index of the first sample in this rank's series", "", 0,
     kMaxI64},
    {"start_ns", JsonType::kArray, true, "wall-clock start of each sample, ns", "", 1, 100000,
     JsonType::kInteger, 0, kMaxI64},
    {"seconds", JsonType::kArray, true, "iteration time of each sample, s", "", 1, 100000,
     JsonType::kNumber, 0, kMaxSeconds},
};
inline constexpr MessageSpec kIterations{"iterations", kIterationsFields,
                                         "a batch of consecutive iteration samples of one rank"};

inline constexpr FieldSpec kAlarmFields[] = {
    FALCON_PROTOCOL_REPORT_FIELDS,
    FALCON_PROTOCOL_RANK_FIELDS,
    {"kind", JsonType::kString, true, "what changed", "slow|recovered"},
    {"onset", JsonType::kInteger, true, "first sample (series index) of the new level", "", 0,
     kMaxI64},
    {"at", JsonType::kInteger, true, "sample (series index) whose arrival raised it", "", 0,
     kMaxI64},
    {"onset_ns", JsonType::kInteger, false, "wall-clock start of the onset sample", "", 0,
     kMaxI64},
    {"ratio", JsonType::kNumber, true, "new level / healthy baseline", "", 0, 1e9},
    {"probability", JsonType::kNumber, true, "change-point posterior", "", 0, 1},
    {"level_s", JsonType::kNumber, true, "new level, seconds per iteration", "", 0, 1e9},
    {"baseline_s", JsonType::kNumber, true, "healthy baseline, seconds per iteration", "", 0,
     1e9},
};
inline constexpr MessageSpec kAlarm{"alarm", kAlarmFields, "a detector alarm for one rank"};

inline constexpr FieldSpec kStallFields[] = {
    FALCON_PROTOCOL_REPORT_FIELDS,
    FALCON_PROTOCOL_RANK_FIELDS,
    {"kind", JsonType::kString, true, "what changed", "stalled|progressing"},
    {"age_s", JsonType::kNumber, true, "seconds since the rank's latest ordered NCCL call", "", 0,
     kMaxSeconds},
    {"bound_s", JsonType::kNumber, true, "the bound it was judged against: max(floor, factor x "
     "its iteration time)", "", 0, kMaxSeconds},
    {"last_call_ns", JsonType::kInteger, false, "wall-clock time of the latest ordered call", "",
     0, kMaxI64},
    {"comm", JsonType::kString, false, "stalled: communicator of the oldest outstanding call (16 "
     "hex digits; absent: a host call on no known communicator)", "", 16, 16},
    {"seq", JsonType::kInteger, false, "stalled: its comm_seq, when known", "", 0, kMaxI64},
    {"op", JsonType::kString, false, "stalled: its operation, when known", "", 1, 64},
    {"in_call", JsonType::kBoolean, false,
     "stalled: a host thread is inside that NCCL call (else its device work is pending)"},
};
inline constexpr MessageSpec kStall{"stall", kStallFields,
                                    "a rank stopped making progress in NCCL, or resumed"};

// One run of a call_signatures communicator: calls seq .. seq + n - 1, issued alike.
inline constexpr FieldSpec kSignatureRunFields[] = {
    {"seq", JsonType::kInteger, true, "comm_seq of the run's first call", "", 0, kMaxI64},
    {"n", JsonType::kInteger, true, "consecutive calls in the run", "", 1, kMaxI64},
    {"op", JsonType::kString, true, "operation (AllReduce, ...)", "", 1, 64},
    {"dtype", JsonType::kInteger, true, "ncclDataType_t, 255 none", "", 0, 255},
    {"count", JsonType::kInteger, true, "element count as passed", "", 0, kMaxI64},
    {"redop", JsonType::kInteger, true, "ncclRedOp_t, -1 none", "", -1, 32767},
    {"root", JsonType::kInteger, true, "root of a rooted collective, -1 none", "", -1, kMaxCommRanks},
};
inline constexpr ObjectSpec kSignatureRunObject{kSignatureRunFields};

// One communicator of a call_signatures.
inline constexpr FieldSpec kSignatureCommFields[] = {
    {"id", JsonType::kString, true, "communicator id, 16 hex digits", "", 16, 16},
    {"nranks", JsonType::kInteger, true, "its members", "", 1, kMaxCommRanks},
    {"runs", JsonType::kArray, true, "the calls, in seq order", "", 1, 65536, JsonType::kObject, kLowest,
     kHighest, &kSignatureRunObject},
};
inline constexpr ObjectSpec kSignatureCommObject{kSignatureCommFields};

// Calls past an agent's signature_full_seqs are sent per block of this many comm_seqs: block b
// holds the collectives with b * kSignatureBlockCalls <= comm_seq < (b + 1) * kSignatureBlockCalls.
// Every member cuts blocks at the same seqs, so like blocks compare by digest alone.
inline constexpr std::uint64_t kSignatureBlockCalls = 1024;

// One block of a call_signatures digest communicator.
inline constexpr FieldSpec kSignatureBlockFields[] = {
    {"seq", JsonType::kInteger, true, "the block's first comm_seq (a multiple of kSignatureBlockCalls)", "", 0,
     kMaxI64},
    {"n", JsonType::kInteger, true, "collectives the rank issued in the block", "", 1,
     static_cast<double>(kSignatureBlockCalls)},
    {"digest", JsonType::kString, true,
     "16 hex digits: the sum mod 2^64 over the block's calls of "
     "protocol::SignatureDigestTerm(comm_seq, op, dtype, count, redop, root)", "", 16, 16},
};
inline constexpr ObjectSpec kSignatureBlockObject{kSignatureBlockFields};

inline constexpr FieldSpec kDigestCommFields[] = {
    {"id", JsonType::kString, true, "communicator id, 16 hex digits", "", 16, 16},
    {"nranks", JsonType::kInteger, true, "its members", "", 1, kMaxCommRanks},
    {"blocks", JsonType::kArray, true, "the blocks completed since the previous message, in seq order", "", 1,
     65536, JsonType::kObject, kLowest, kHighest, &kSignatureBlockObject},
};
inline constexpr ObjectSpec kDigestCommObject{kDigestCommFields};

inline constexpr FieldSpec kCallSignaturesFields[] = {
    FALCON_PROTOCOL_REPORT_FIELDS,
    FALCON_PROTOCOL_RANK_FIELDS,
    {"comms", JsonType::kArray, true,
     "per communicator: {id, nranks, runs: [{seq, n, op, dtype, count, redop, root}]}: the "
     "collectives issued since the previous message (sends, receives and communicator setup are "
     "not compared; nor are communicators of more than two ranks carrying sends or receives, "
     "whose comm_seq differs between members)",
     "", 0, kMaxCommsPerRank, JsonType::kObject, kLowest, kHighest, &kSignatureCommObject},
    {"dropped", JsonType::kInteger, false, "calls left out since the previous message (over the "
     "per-message cap, or records the agent lost)", "", 0, kMaxI64},
    {"digests", JsonType::kArray, false,
     "per communicator: {id, nranks, blocks: [{seq, n, digest}]}: blocks of kSignatureBlockCalls "
     "collectives sent as one digest each instead of as runs (calls past the agent's "
     "signature_full_seqs); members compare a block by its digest",
     "", 0, kMaxCommsPerRank, JsonType::kObject, kLowest, kHighest, &kDigestCommObject},
};
inline constexpr MessageSpec kCallSignatures{"call_signatures", kCallSignaturesFields,
                                             "one rank's newly issued collectives, for mismatch detection"};

inline constexpr FieldSpec kCommProfileFields[] = {
    FALCON_PROTOCOL_REPORT_FIELDS,
    FALCON_PROTOCOL_RANK_FIELDS,
    {"since_ns", JsonType::kInteger, true, "wall-clock start of the window", "", 0, kMaxI64},
    {"mode", JsonType::kString, true, "recording mode during the window",
     "track|profile|sample|off"},
    {"comms", JsonType::kArray, true,
     "per communicator: {id, rank, nranks, sigs: [{op, bytes, peer, count, mean_us?, "
     "median_us?, clock?}]}; mean/median only for timed calls (profile/sample): clock "
     "\"device\" when they are CUDA-event times of the calls' work (a group's calls share the "
     "group's), \"host\" when host times (no GPU)",
     "", 0, kMaxCommsPerRank, JsonType::kObject, kLowest, kHighest, &kProfileCommObject},
};
inline constexpr MessageSpec kCommProfile{"comm_profile", kCommProfileFields,
                                          "per-communicator profile of one rank over a window"};

// Controller → agent commands. Common fields first; `ranks` absent = every rank the agent has.
#define FALCON_PROTOCOL_COMMAND_FIELDS                                                         \
  {"id", JsonType::kString, true, "command id, unique per job (echoed in the ack)", "", 1, 64}, \
      {"issued_ns", JsonType::kInteger, true, "wall-clock issue time", "", 0, kMaxI64},         \
      {"deadline_ns", JsonType::kInteger, false, "not executed after this (ack expired)", "", 0, \
       kMaxI64},                                                                                \
      {"ranks", JsonType::kArray, false, "target ranks (absent: all of the agent's)", "", 0,    \
       kMaxRank, JsonType::kInteger, -1, kMaxRank}

inline constexpr FieldSpec kSetModeFields[] = {
    FALCON_PROTOCOL_COMMAND_FIELDS,
    {"mode", JsonType::kString, true, "recording mode", "track|profile|sample|off"},
    {"sample_every", JsonType::kInteger, false, "N for sample mode (default 100)", "", 1, 1000000},
};
inline constexpr MessageSpec kSetMode{"set_mode", kSetModeFields, "change the shim's mode"};

inline constexpr FieldSpec kPauseFields[] = {
    FALCON_PROTOCOL_COMMAND_FIELDS,
    {"at_iteration", JsonType::kInteger, true, "pause at this iteration boundary", "", 0, kMaxI64},
    {"max_pause_s", JsonType::kNumber, true, "resume by itself after this long", "", 0.001, 3600},
    {"comm", JsonType::kString, false,
     "communicator id (16 hex digits) whose call comm_seq is the cut; the shim trap needs it",
     "", 16, 16},
    {"comm_seq", JsonType::kInteger, false,
     "stop before this call (0-based, per communicator) of comm; same on every rank", "", 0,
     kMaxI64},
    {"targets", JsonType::kArray, false,
     "the consistent cut per rank, instead of comm/comm_seq: {rank, t: [[comm, trigger_seq, "
     "expect_seq], ...]} (at most 16 communicators); a rank stops before the call of comm with "
     "comm_seq trigger_seq (after its group), then must have issued expect_seq calls on each",
     "", 1, kMaxRank, JsonType::kObject},
};
inline constexpr MessageSpec kPause{"pause", kPauseFields,
                                    "trap the ranks at an agreed iteration boundary"};

// cut_info: each rank's recent call pattern (ack result `pattern`), from which the controller
// or falcon-ctl plans a consistent cut (analyzer/cut_plan.h) for a pause's `targets`.
inline constexpr FieldSpec kCutInfoFields[] = {FALCON_PROTOCOL_COMMAND_FIELDS};
inline constexpr MessageSpec kCutInfo{"cut_info", kCutInfoFields,
                                      "report each rank's call pattern for a consistent cut"};

// progress: each rank's progress on its communicators (ack result `progress`: one rank of the
// falcon-progress document, daemon/shm/progress_json.h), for a job-wide hang diagnosis.
inline constexpr FieldSpec kProgressFields[] = {
    FALCON_PROTOCOL_COMMAND_FIELDS,
    {"calls", JsonType::kInteger, false, "latest calls per communicator to include (default 16)", "", 1,
     256},
};
inline constexpr MessageSpec kProgressCommand{"progress", kProgressFields,
                                              "report each rank's progress for a hang diagnosis"};

inline constexpr FieldSpec kResumeFields[] = {FALCON_PROTOCOL_COMMAND_FIELDS};
inline constexpr MessageSpec kResume{"resume", kResumeFields, "release a pause"};

// Validation traffic runs on a communicator Falcon owns, never on the job's: vcomm_id on one
// rank makes its unique id (ack result `blob`), vcomm_join on every member joins it (ok once all
// have joined and hold their buffers), then p2p transfers run on it. It lasts until the resume.
// One command may carry several ranks of a host, each with its own peer (`peers`) or validation
// rank (`vrank_each`), so that a step costs one command per host, not one per rank.
inline constexpr FieldSpec kValidateFields[] = {
    FALCON_PROTOCOL_COMMAND_FIELDS,
    {"task", JsonType::kString, true, "benchmark kind", "gemm|p2p|vcomm_id|vcomm_join"},
    {"comm", JsonType::kString, false,
     "p2p: the job's communicator (16 hex digits) whose link the transfer measures, for the record", "", 16, 16},
    {"peer", JsonType::kInteger, false, "p2p: peer rank in the validation communicator", "", 0, kMaxRank},
    {"shift", JsonType::kInteger, false,
     "p2p instead of peer: validation rank r sends to r+shift and receives from r-shift (mod vranks)",
     "", 1, kMaxRank},
    {"peers", JsonType::kArray, false,
     "p2p instead of peer: each target rank's peer in the validation communicator, in the order of ranks", "", 1,
     kMaxRank, JsonType::kInteger, 0, kMaxRank},
    {"bytes", JsonType::kInteger, false, "p2p message size; vcomm_join: transfer buffer size", "", 1, 1e10},
    {"blob", JsonType::kString, false, "vcomm_join: the unique id from vcomm_id, 256 hex digits", "", 256, 256},
    {"vranks", JsonType::kInteger, false, "vcomm_join: members of the validation communicator", "", 2, kMaxRank},
    {"vrank", JsonType::kInteger, false, "vcomm_join: the target rank's rank in it", "", 0, kMaxRank},
    {"vrank_each", JsonType::kArray, false,
     "vcomm_join instead of vrank: each target rank's rank in it, in the order of ranks", "", 1, kMaxRank,
     JsonType::kInteger, 0, kMaxRank},
    {"size", JsonType::kInteger, false, "gemm: matrix dimension", "", 1, 65536},
    {"dtype", JsonType::kString, false,
     "gemm: element type (default fp32, cuBLAS SGEMM; bf16 / fp16: GemmEx, fp32 accumulation, tensor cores)",
     "fp32|bf16|fp16"},
    {"repeats", JsonType::kInteger, false, "timed repetitions (default 5)", "", 1, 1000},
};
inline constexpr MessageSpec kValidate{"validate", kValidateFields,
                                       "run a validation benchmark while paused"};

// The plan fields, shared by the plan command and the mitigation_plan hash. Micro-batch counts
// are indexed by DP replica = a rank's rank in its data-parallel communicator (the order
// Megatron-style frameworks use); placement maps every global rank to a node index.
#define FALCON_PROTOCOL_PLAN_FIELDS                                                              \
  {"plan_version", JsonType::kInteger, true, "increases with every decision of the job", "", 1,  \
   2147483647},                                                                                  \
      {"strategy", JsonType::kString, true, "S1 ignore (also: undo), S2 re-balance, S3 "         \
       "re-place, S4 restart, pipeline: new warm-up counts", "S1|S2|S3|S4|pipeline"},            \
      {"micro_batches", JsonType::kArray, false,                                                 \
       "S2: micro-batches per DP replica, each 1..4096", "", 1, 4096, JsonType::kInteger, 1, 4096}, \
      {"placement", JsonType::kArray, false,                                                     \
       "S3/S4: node index (0..65535) of every global rank", "", 1, 65536, JsonType::kInteger, 0, \
       65535},                                                                                   \
      {"exclude_nodes", JsonType::kArray, false, "S4: node indices to leave out", "", 0, 65536,  \
       JsonType::kInteger, 0, 65535},                                                            \
      {"restart", JsonType::kBoolean, false, "S4: restart from the last checkpoint"},            \
      {"warmup", JsonType::kArray, false,                                                        \
       "pipeline: warm-up forwards per pipeline stage (Megatron's num_warmup_microbatches), "    \
       "non-increasing, each 0..65535", "", 1, 1024, JsonType::kInteger, 0, 65535}

inline constexpr FieldSpec kPlanCommandFields[] = {
    FALCON_PROTOCOL_COMMAND_FIELDS,
    FALCON_PROTOCOL_PLAN_FIELDS,
};
inline constexpr MessageSpec kPlanCommand{
    "plan", kPlanCommandFields,
    "act mode: hand a mitigation plan to the shims (falcon.h C API) for the framework to apply"};

inline constexpr MessageSpec kCommands[] = {kSetMode,     kPause,   kResume,          kValidate,
                                            kPlanCommand, kCutInfo, kProgressCommand};

inline constexpr FieldSpec kAckFields[] = {
    FALCON_PROTOCOL_REPORT_FIELDS,
    {"command", JsonType::kString, true, "the command's id", "", 1, 64},
    {"command_type", JsonType::kString, true, "the command's type", "", 1, 32},
    {"status", JsonType::kString, true, "outcome", "ok|unsupported|rejected|failed|expired"},
    {"detail", JsonType::kString, false, "human-readable reason", "", 0, kMaxText},
    {"ranks", JsonType::kArray, true, "ranks the command was applied to", "", 0, kMaxRank,
     JsonType::kInteger, -1, kMaxRank},
    {"results", JsonType::kArray, false,
     "pause/resume/validate/cut_info/progress: per rank {rank, state, task_status?, median_s?, "
     "min_s?, max_s?, rate?, blob? (vcomm_id: the unique id, 256 hex digits), pattern? "
     "(cut_info), progress? (progress: the rank in the falcon-progress format)}", "", 0,
     kMaxRank, JsonType::kObject, kLowest, kHighest, &kAckResultObject},
};
inline constexpr MessageSpec kAck{"ack", kAckFields, "an agent's answer to one command"};

inline constexpr FieldSpec kIncidentFields[] = {
    {"id", JsonType::kString, true, "incident id", "", 1, 64},
    {"job", JsonType::kString, true, "job name", "", 1, 128},
    {"stage", JsonType::kString, true,
     "what this entry records: a fail-slow's detection, localisation, decision, resolution; a "
     "hang's diagnosis (hang, mismatch, deadlock, disorder) and resolution",
     "detection|localisation|decision|resolution|hang|mismatch|deadlock|disorder"},
    {"at_ns", JsonType::kInteger, true, "wall-clock time", "", 0, kMaxI64},
    {"summary", JsonType::kString, true, "one line for people", "", 1, kMaxText},
    {"ranks", JsonType::kArray, false, "ranks involved", "", 0, kMaxRank, JsonType::kInteger, -1, kMaxRank},
    {"comms", JsonType::kArray, false, "communicator ids involved", "", 0, 65536,
     JsonType::kString},
    {"cause", JsonType::kString, false, "root cause", "compute|link|nic|unknown"},
    {"strategy", JsonType::kString, false, "mitigation chosen", "S1|S2|S3|S4|pipeline"},
    {"detail", JsonType::kObject, false, "stage-specific data"},
};
inline constexpr MessageSpec kIncident{"incident", kIncidentFields,
                                       "one stage of an incident (kIncidentsStream)"};

inline constexpr FieldSpec kAlertFields[] = {
    {"job", JsonType::kString, true, "job name", "", 1, 128},
    {"at_ns", JsonType::kInteger, true, "wall-clock time", "", 0, kMaxI64},
    {"severity", JsonType::kString, true, "how urgent", "info|warning|critical"},
    {"source", JsonType::kString, true, "who raised it", "agent|controller"},
    {"summary", JsonType::kString, true, "one line for people", "", 1, kMaxText},
    {"host", JsonType::kString, false, "node concerned", "", 1, 128},
    {"rank", JsonType::kInteger, false, "rank concerned", "", -1, kMaxRank},
    {"incident", JsonType::kString, false, "incident id, if any", "", 1, 64},
};
inline constexpr MessageSpec kAlert{"alert", kAlertFields, "a live alert (kAlertsChannel)"};

inline constexpr FieldSpec kControllerStateFields[] = {
    {"job", JsonType::kString, true, "job name", "", 1, 128},
    {"at_ns", JsonType::kInteger, true, "wall-clock time of this write", "", 0, kMaxI64},
    {"pid", JsonType::kInteger, true, "controller pid", "", 1, 4194304},
    {"host", JsonType::kString, true, "controller's node name", "", 1, 128},
    {"version", JsonType::kString, true, "controller version", "", 1, 64},
    {"started_ns", JsonType::kInteger, true, "this controller process's start, wall ns", "", 0,
     kMaxI64},
    {"state", JsonType::kString, true, "phase now", "tracking|profiling|validating"},
    {"since_ns", JsonType::kInteger, true, "when the phase began, wall ns", "", 0, kMaxI64},
    {"ranks", JsonType::kInteger, true, "live ranks registered", "", 0, kMaxRank},
    {"agents", JsonType::kInteger, true, "live agents", "", 0, kMaxRank},
    {"current_s", JsonType::kNumber, false, "job iteration time now (slowest rank, median of the "
     "last samples), s", "", 0, kMaxSeconds},
    {"healthy_s", JsonType::kNumber, false, "healthy iteration time (before the open incident), s",
     "", 0, kMaxSeconds},
    {"period", JsonType::kInteger, false, "calls per iteration (most common over ranks)", "", 1,
     kMaxI64},
    {"mode", JsonType::kString, false, "recording mode the controller asked for",
     "track|profile|sample|off"},
    {"incident", JsonType::kString, false, "open incident id", "", 1, 64},
    {"slow_ranks", JsonType::kArray, true, "ranks whose last alarm is slow", "", 0, kMaxRank,
     JsonType::kInteger, -1, kMaxRank},
    {"incidents", JsonType::kInteger, true, "incidents opened by this job so far", "", 0, kMaxI64},
    {"mitigation", JsonType::kString, false, "decision mode", "off|advise|act"},
    {"strategy", JsonType::kString, false, "mitigation in force for the open incident (S1: none yet)",
     "S1|S2|S3|S4|pipeline"},
    {"plan_version", JsonType::kInteger, false, "version of the last plan published", "", 1,
     2147483647},
    {"state_doc", JsonType::kObject, true,
     "everything needed to resume: cursors, incident, suspicion, attempts (see docs/controller.md)"},
};
inline constexpr MessageSpec kControllerState{"controller_state", kControllerStateFields,
                                              "the controller's persisted state (kControllerKey)"};

inline constexpr FieldSpec kControllerRequestFields[] = {
    {"id", JsonType::kString, true, "request id, unique per job (echoed in the incident's detail)", "", 1, 64},
    {"issued_ns", JsonType::kInteger, true, "wall-clock issue time", "", 0, kMaxI64},
    {"action", JsonType::kString, true, "what to do", "validate"},
    {"by", JsonType::kString, false, "who asked (user@host, tool)", "", 0, 128},
    {"reason", JsonType::kString, false, "why, for the incident record", "", 0, kMaxText},
};
inline constexpr MessageSpec kControllerRequest{"controller_request", kControllerRequestFields,
                                                "a request to the controller (kRequestsStream)"};

inline constexpr FieldSpec kMitigationPlanFields[] = {
    {"job", JsonType::kString, true, "job name", "", 1, 128},
    {"at_ns", JsonType::kInteger, true, "wall-clock time of the decision", "", 0, kMaxI64},
    {"incident", JsonType::kString, false, "incident the plan answers", "", 1, 64},
    {"mode", JsonType::kString, true, "advise: published only; act: sent to the agents",
     "advise|act"},
    FALCON_PROTOCOL_PLAN_FIELDS,
    {"expected_gain", JsonType::kNumber, false,
     "expected iteration-time reduction, fraction of the slow iteration time", "", -1, 1},
    {"reason", JsonType::kString, false, "why, for people", "", 0, kMaxText},
    {"detail", JsonType::kObject, false, "planner data (costs, candidates)"},
};
inline constexpr MessageSpec kMitigationPlan{"mitigation_plan", kMitigationPlanFields,
                                             "the plan in force (kPlanKey)"};

inline constexpr MessageSpec kAllMessages[] = {kRankRegister,   kAgentHeartbeat, kIterations,
                                               kAlarm,          kCommProfile,    kSetMode,
                                               kPause,          kResume,         kValidate,
                                               kAck,            kIncident,       kAlert,
                                               kControllerState, kControllerRequest,
                                               kPlanCommand,    kMitigationPlan, kCutInfo,
                                               kStall,          kProgressCommand, kCallSignatures};

#undef FALCON_PROTOCOL_REPORT_FIELDS
#undef FALCON_PROTOCOL_RANK_FIELDS
#undef FALCON_PROTOCOL_COMMAND_FIELDS
#undef FALCON_PROTOCOL_PLAN_FIELDS

// The spec of `type`, or nullptr.
constexpr const MessageSpec* FindMessage(std::string_view type) {
  for (const MessageSpec& m : kAllMessages) {
    if (m.type == type) return &m;
  }
  return nullptr;
}

// The spec of command `type` (set_mode, pause, resume, validate, plan), or nullptr.
constexpr const MessageSpec* FindCommand(std::string_view type) {
  for (const MessageSpec& m : kCommands) {
    if (m.type == type) return &m;
  }
  return nullptr;
}

}  // namespace falcon::protocol
