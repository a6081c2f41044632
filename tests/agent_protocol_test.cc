// The Redis protocol (include/falcon/protocol.h): key formatting, and validation of every
// message type — a valid example of each (built by the same ToJson the agent uses) passes, and
// every mutation the schema forbids fails: each required field removed, each field given the
// wrong JSON type, string choices and numeric bounds violated, wrong version or type, non-JSON.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "daemon/protocol/keys.h"
#include "daemon/protocol/messages.h"
#include "daemon/protocol/rank_beat.h"
#include "daemon/protocol/validate.h"
#include "falcon/protocol.h"
#include "falcon/shm_abi.h"

namespace falcon::protocol {
namespace {

using nlohmann::json;

ReportHeader H() { return {"job1", "node-a", 1700000000000000000}; }

json Example(std::string_view type) {
  if (type == kRankRegister.type) {
    RankRegistration m;
    m.header = H();
    m.rank = 3;
    m.pid = 4242;
    m.exe = "train";
    m.started_ns = 1;
    m.comms = {{0xabcdef0123456789ull, 1, 4, "world"}};
    m.period = 9;
    m.plan_delivered = 3;
    m.plan_applied = 2;
    m.plan_rejected = 3;
    return ToJson(m);
  }
  if (type == kAgentHeartbeat.type) {
    AgentHeartbeat m;
    m.header = H();
    m.pid = 7;
    m.version = "0.1.0";
    m.ranks = {0, 1};
    m.beats = {{{0, 5, {7, 8}, 10, 0, 3, 0}, {1, 6, {}, 0, 0, 0, 2}}};
    return ToJson(m);
  }
  if (type == kIterations.type) {
    IterationBatch m;
    m.header = H();
    m.rank = 0;
    m.pid = 9;
    m.period = 9;
    m.start_ns = {1, 2};
    m.seconds = {0.5, 0.51};
    return ToJson(m);
  }
  if (type == kAlarm.type) {
    AlarmReport m;
    m.header = H();
    m.rank = 1;
    m.pid = 9;
    m.kind = "slow";
    m.onset = 10;
    m.at = 14;
    m.onset_ns = 5;
    m.ratio = 1.5;
    m.probability = 0.99;
    m.level_s = 0.3;
    m.baseline_s = 0.2;
    return ToJson(m);
  }
  if (type == kCallSignatures.type) {
    CallSignatures m;
    m.header = H();
    m.rank = 5;
    m.pid = 9;
    m.comms = {{0xff, 4, {{40, 24, "AllReduce", 7, 4096, 0, -1}, {64, 1, "Broadcast", 7, 16, -1, 2}}}};
    m.dropped = 3;
    return ToJson(m);
  }
  if (type == kStall.type) {
    StallReport m;
    m.header = H();
    m.rank = 5;
    m.pid = 9;
    m.kind = "stalled";
    m.age_s = 12.5;
    m.bound_s = 5;
    m.last_call_ns = 7;
    m.comm = "00000000000000ff";
    m.seq = 41;
    m.op = "AllReduce";
    m.in_call = false;
    return ToJson(m);
  }
  if (type == kCommProfile.type) {
    CommProfileReport m;
    m.header = H();
    m.rank = 1;
    m.pid = 9;
    m.comms = {{1, 0, 2, {{"AllReduce", 1024, -1, 10, 5.0, 4.5, "device"}}}};
    return ToJson(m);
  }
  if (type == kAck.type) {
    Ack m;
    m.header = H();
    m.command = "c1";
    m.command_type = "set_mode";
    m.status = "ok";
    m.ranks = {1};
    return ToJson(m);
  }
  if (type == kAlert.type) {
    Alert m;
    m.job = "job1";
    m.at_ns = 1;
    m.severity = "warning";
    m.source = "agent";
    m.summary = "rank 1 is slow";
    m.rank = 1;
    return ToJson(m);
  }
  if (type == kControllerRequest.type) {
    return {{"v", kSchemaVersion}, {"type", "controller_request"}, {"id", "req-1"}, {"issued_ns", 3},
            {"action", "validate"}, {"by", "alice@head"}, {"reason", "drill"}};
  }
  if (type == kControllerState.type) {
    return {{"v", kSchemaVersion}, {"type", "controller_state"}, {"job", "job1"}, {"at_ns", 5},
            {"pid", 42}, {"host", "head"}, {"version", "0.1.0"}, {"started_ns", 1},
            {"state", "profiling"}, {"since_ns", 4}, {"ranks", 16}, {"agents", 8},
            {"current_s", 0.2}, {"healthy_s", 0.1}, {"period", 57}, {"mode", "profile"},
            {"incident", "inc-1"}, {"slow_ranks", {3}}, {"incidents", 1},
            {"state_doc", {{"cursors", {{"alarms", "0-0"}}}}}};
  }
  if (type == kIncident.type) {
    return {{"v", kSchemaVersion}, {"type", "incident"}, {"id", "i1"}, {"job", "job1"},
            {"stage", "detection"}, {"at_ns", 1}, {"summary", "rank 3 slow"}, {"ranks", {3}},
            {"comms", {"00000000000000ff"}}, {"cause", "compute"}, {"strategy", "S2"},
            {"detail", {{"ratio", 1.4}}}};
  }
  if (type == kMitigationPlan.type) {
    return {{"v", kSchemaVersion}, {"type", "mitigation_plan"}, {"job", "job1"}, {"at_ns", 6},
            {"incident", "inc-1"}, {"mode", "advise"}, {"plan_version", 2}, {"strategy", "S2"},
            {"micro_batches", {4, 4, 2, 6}}, {"expected_gain", 0.3}, {"reason", "rank 3 slow"},
            {"detail", {{"solve_us", 12}}}};
  }
  Command c;
  c.type = std::string(type);
  c.id = "cmd-1";
  c.plan_version = 3;
  c.strategy = "S3";
  c.micro_batches = {2, 3};
  c.placement = {1, 0, 2, 3};
  c.issued_ns = 1;
  c.ranks = std::vector<std::int64_t>{0, 1};
  c.mode = "profile";
  c.at_iteration = 100;
  c.max_pause_s = 5;
  c.task = "p2p";
  c.comm = "00000000000000ff";
  c.peer = 1;
  c.bytes = 1 << 20;
  c.targets = {{0, {{0xff, 10, 10}, {0xaa, 4, 5}}}};
  c.calls = 8;
  return ToJson(c);
}

json WrongTypeValue(JsonType t) {
  switch (t) {
    case JsonType::kString: return 12;
    case JsonType::kInteger: return 1.5;
    case JsonType::kNumber: return "1.5";
    case JsonType::kBoolean: return 1;
    case JsonType::kObject: return json::array();
    case JsonType::kArray: return json::object();
  }
  return nullptr;
}

class ProtocolTest : public ::testing::TestWithParam<MessageSpec> {};

TEST_P(ProtocolTest, ExampleIsValidAndRoundTripsThroughText) {
  const MessageSpec& spec = GetParam();
  const json m = Example(spec.type);
  EXPECT_TRUE(ValidateMessage(m, spec).ok()) << ValidateMessage(m, spec).ToString() << m.dump();
  const Result<json> parsed = ParseMessage(m.dump(), spec);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  for (const FieldSpec& f : spec.fields) {
    if (f.required) {
      EXPECT_TRUE(m.contains(f.name)) << spec.type << " example lacks " << f.name;
    }
  }
}

TEST_P(ProtocolTest, EveryRequiredFieldIsRequired) {
  const MessageSpec& spec = GetParam();
  for (const FieldSpec& f : spec.fields) {
    if (!f.required) continue;
    json m = Example(spec.type);
    m.erase(std::string(f.name));
    EXPECT_FALSE(ValidateMessage(m, spec).ok()) << spec.type << " without " << f.name;
    m[std::string(f.name)] = nullptr;
    EXPECT_FALSE(ValidateMessage(m, spec).ok()) << spec.type << " with null " << f.name;
  }
}

TEST_P(ProtocolTest, EveryFieldIsTypeChecked) {
  const MessageSpec& spec = GetParam();
  for (const FieldSpec& f : spec.fields) {
    json m = Example(spec.type);
    m[std::string(f.name)] = WrongTypeValue(f.type);
    const Status s = ValidateMessage(m, spec);
    EXPECT_FALSE(s.ok()) << spec.type << "." << f.name;
    EXPECT_NE(s.message().find(std::string(f.name)), std::string::npos) << s.message();
  }
}

TEST_P(ProtocolTest, ChoicesBoundsAndArrayElementsAreChecked) {
  const MessageSpec& spec = GetParam();
  for (const FieldSpec& f : spec.fields) {
    json m = Example(spec.type);
    if (f.type == JsonType::kString && !f.choices.empty()) {
      m[std::string(f.name)] = "no-such-choice";
    } else if ((f.type == JsonType::kInteger || f.type == JsonType::kNumber) && f.min > -1e18) {
      m[std::string(f.name)] = f.type == JsonType::kInteger
                                   ? json(static_cast<std::int64_t>(f.min) - 1)
                                   : json(f.min - 1.0);
    } else if (f.type == JsonType::kArray && f.items != JsonType::kObject) {
      m[std::string(f.name)] = json::array({WrongTypeValue(f.items)});
    } else {
      continue;
    }
    EXPECT_FALSE(ValidateMessage(m, spec).ok()) << spec.type << "." << f.name << " = "
                                                << m[std::string(f.name)].dump();
  }
}

TEST_P(ProtocolTest, VersionTypeAndSyntaxAreChecked) {
  const MessageSpec& spec = GetParam();
  json m = Example(spec.type);
  m["v"] = kSchemaVersion + 1;
  EXPECT_FALSE(ValidateMessage(m, spec).ok());
  m.erase("v");
  EXPECT_FALSE(ValidateMessage(m, spec).ok());
  m = Example(spec.type);
  m["type"] = "something_else";
  EXPECT_FALSE(ValidateMessage(m, spec).ok());
  m = Example(spec.type);
  m["unknown_future_field"] = 1;  // forward compatible
  EXPECT_TRUE(ValidateMessage(m, spec).ok());
  for (const char* bad : {"", "{", "[]", "42", "\"x\"", "{\"v\":1,", "null"}) {
    EXPECT_FALSE(ParseMessage(bad, spec).ok()) << bad;
  }
  EXPECT_FALSE(ParseMessage(std::string(kMaxMessageBytes + 1, ' '), spec).ok());
}

// Every number a message can carry has finite bounds: fields, array elements, and the fields of
// the array elements the schema looks into (one unbounded number is a value the controller may
// later fail to save, or size an allocation by).
void ExpectBounded(const std::string& where, std::span<const FieldSpec> fields) {
  constexpr double kLow = std::numeric_limits<double>::lowest(), kHigh = std::numeric_limits<double>::max();
  for (const FieldSpec& f : fields) {
    const std::string name = where + "." + std::string(f.name);
    if (f.type == JsonType::kInteger || f.type == JsonType::kNumber) {
      EXPECT_TRUE(f.min > kLow && f.max < kHigh) << name;
    }
    if (f.type == JsonType::kArray && (f.items == JsonType::kInteger || f.items == JsonType::kNumber)) {
      EXPECT_TRUE(f.item_min > kLow && f.item_max < kHigh) << name << "[]";
    }
    if (f.type == JsonType::kArray && f.item_object != nullptr) ExpectBounded(name + "[]", f.item_object->fields);
  }
}

TEST_P(ProtocolTest, EveryNumberIsBounded) {
  const MessageSpec& spec = GetParam();
  ExpectBounded(std::string(spec.type), spec.fields);
}

TEST_P(ProtocolTest, ArrayElementBoundsAreChecked) {
  const MessageSpec& spec = GetParam();
  for (const FieldSpec& f : spec.fields) {
    if (f.type != JsonType::kArray || (f.items != JsonType::kInteger && f.items != JsonType::kNumber)) continue;
    const bool integer = f.items == JsonType::kInteger;
    for (const json& bad : {integer ? json(static_cast<std::int64_t>(f.item_min) - 1) : json(f.item_min - 1.0),
                            integer ? (f.item_max > 1e15 ? json(std::numeric_limits<std::uint64_t>::max())
                                                         : json(static_cast<std::uint64_t>(f.item_max) + 1))
                                    : json(f.item_max * 2 + 1)}) {
      json m = Example(spec.type);
      m[std::string(f.name)] = json::array({bad});
      const Status st = ValidateMessage(m, spec);
      EXPECT_FALSE(st.ok()) << spec.type << "." << f.name << " = [" << bad.dump() << "]";
      EXPECT_NE(st.message().find(std::string(f.name)), std::string::npos) << st.message();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllMessages, ProtocolTest, ::testing::ValuesIn(kAllMessages),
                         [](const auto& p) { return std::string(p.param.type); });

// What broke the controller once: each is refused, and the Status names the element.
TEST(ProtocolBoundsTest, HostileSizesAndNumbersAreRefused) {
  struct Case {
    const char* what;
    std::string_view type;
    std::function<void(json&)> mutate;
    const char* names;  // in the error
  };
  const std::vector<Case> cases = {
      {"a claimed 16M-member communicator", kRankRegister.type,
       [](json& m) { m["comms"][0]["nranks"] = 16777216; }, "rank_register.comms[0].nranks"},
      {"comm rank beyond any communicator", kRankRegister.type,
       [](json& m) { m["comms"][0]["rank"] = 1 << 20; }, "rank_register.comms[0].rank"},
      {"a communicator entry without its size", kRankRegister.type,
       [](json& m) { m["comms"][0].erase("nranks"); }, "rank_register.comms[0].nranks"},
      {"too many communicators", kRankRegister.type,
       [](json& m) {
         const json one = m["comms"][0];
         m["comms"] = json::array();
         for (int i = 0; i < static_cast<int>(kMaxCommsPerRank) + 1; ++i) m["comms"].push_back(one);
       },
       "rank_register.comms"},
      {"1e300 seconds", kIterations.type, [](json& m) { m["seconds"] = {1e300, 0.5}; }, "iterations.seconds"},
      {"negative seconds", kIterations.type, [](json& m) { m["seconds"] = {0.5, -1.0}; }, "iterations.seconds"},
      {"negative start", kIterations.type, [](json& m) { m["start_ns"] = {1, -5}; }, "iterations.start_ns"},
      {"profile signature bytes", kCommProfile.type,
       [](json& m) { m["comms"][0]["sigs"][0]["bytes"] = -1; }, "comm_profile.comms[0].sigs[0].bytes"},
      {"profile time", kCommProfile.type,
       [](json& m) { m["comms"][0]["sigs"][0]["median_us"] = 1e300; }, "comm_profile.comms[0].sigs[0].median_us"},
      {"benchmark time", kAck.type,
       [](json& m) { m["results"] = json::array({json{{"rank", 0}, {"state", "trapped"}, {"median_s", 1e300}}}); },
       "ack.results[0].median_s"},
  };
  for (const Case& c : cases) {
    json m = Example(c.type);
    c.mutate(m);
    const Status st = ValidateMessage(m, *FindMessage(c.type));
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_NE(st.message().find(c.names), std::string::npos) << c.what << ": " << st.message();
  }
}

// The agent writes call_signatures without the JSON tree (Dump); a reader must not be able to
// tell: the text is ToJson's, byte for byte, whatever the fields hold.
TEST(ProtocolDumpTest, CallSignaturesDumpIsToJsonsTextByteForByte) {
  std::vector<CallSignatures> cases;
  CallSignatures empty;
  empty.header = H();
  cases.push_back(empty);  // no comms, no dropped, rank -1
  CallSignatures odd;
  odd.header = {"job \"quoted\" \\ \x01 tab\t", "n\xc5\x93ud-\xc3\xa4", -5};  // escapes, UTF-8
  odd.rank = std::numeric_limits<std::int64_t>::max();
  odd.pid = std::numeric_limits<std::int64_t>::min();
  odd.dropped = std::numeric_limits<std::uint64_t>::max();
  odd.comms = {{0, 0, {}}, {~0ull, -1, {{~0ull, 0, "", -7, ~0ull, std::numeric_limits<std::int32_t>::min(), 1 << 20}}}};
  cases.push_back(odd);
  std::mt19937_64 rng(42);
  const char* ops[] = {"AllReduce", "ReduceScatter", "AllGather", "Broadcast", "AlltoAll"};
  for (int i = 0; i < 200; ++i) {
    CallSignatures m;
    // Within the schema's bounds (non-negative, at most kMaxI64: shifted right by at least 2).
    m.header = {"job-" + std::to_string(rng() % 1000), "host" + std::to_string(rng()), static_cast<std::int64_t>(rng() >> 2)};
    m.rank = static_cast<std::int64_t>(rng() % 32768);
    m.pid = static_cast<std::int64_t>(rng() % 4000000);
    if (rng() % 2 == 0) m.dropped = rng() % 100000;
    for (std::uint64_t c = rng() % 4; c > 0; --c) {
      CommSignatures comm{rng(), 1 + static_cast<std::int32_t>(rng() % 4096), {}};
      for (std::uint64_t r = 1 + rng() % 50; r > 0; --r) {
        comm.runs.push_back({rng() >> (2 + rng() % 62), 1 + rng() % 1000, ops[rng() % 5], static_cast<std::int32_t>(rng() % 13),
                             rng() >> (2 + rng() % 62), static_cast<std::int32_t>(rng() % 7) - 1,
                             static_cast<std::int32_t>(rng() % 9) - 1});
      }
      m.comms.push_back(std::move(comm));
    }
    cases.push_back(std::move(m));
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string text = Dump(cases[i]);
    ASSERT_EQ(text, ToJson(cases[i]).dump()) << "case " << i;
    // The random ones are within the schema: what the agent sends, the controller accepts.
    if (i >= 2) {
      EXPECT_TRUE(ValidateMessage(json::parse(text), kCallSignatures).ok()) << text.substr(0, 200);
    }
  }
  CallSignatures bad = empty;
  bad.header.host = "\xff";  // not UTF-8: refused as dump() refuses it, never written broken
  EXPECT_THROW((void)Dump(bad), nlohmann::json::type_error);
}

// cut_info's pattern and pause's targets: round trips, and every malformed part is refused.
TEST(ProtocolCutTest, PatternsAndTargetsRoundTripAndBadOnesAreRefused) {
  CutPatternMessage m;
  m.pattern.rank = 5;
  m.pattern.comms = {{0xabc, 4, 3, -1, {}}, {0xdef, 2, 77, -1, {}}};
  m.pattern.units = {{false, {{1, 1}}}, {false, {{1, 1}}}, {false, {{1, 1}}}, {true, {{0, 1}, {1, 2}}}};
  m.pattern.iteration_at_start = 12;
  m.position = 40;
  m.units_per_s = 250.5;
  m.age_s = 0.25;
  const json j = CutPatternToJson(m);
  EXPECT_EQ(j["units"].size(), 2u) << "three like units are one run: " << j.dump();
  const auto back = ParseCutPattern(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back.value().pattern.units.size(), 4u);
  EXPECT_EQ(back.value().pattern.units[3].calls.size(), 2u);
  EXPECT_EQ(back.value().pattern.units[3].calls[1].count, 2u);
  EXPECT_EQ(back.value().pattern.comms[1].base_seq, 77u);
  EXPECT_EQ(back.value().pattern.iteration_at_start, std::optional<std::uint64_t>(12));
  EXPECT_EQ(back.value().position, 40u);
  const std::vector<std::pair<const char*, std::function<void(json&)>>> breaks = {
      {"not an object", [](json& x) { x = json::array(); }},
      {"negative position", [](json& x) { x["position"] = -1; }},
      {"nan pace", [](json& x) { x["units_per_s"] = "fast"; }},
      {"huge age", [](json& x) { x["age_s"] = 1e300; }},
      {"bad comm id", [](json& x) { x["comms"][0][0] = "xyz"; }},
      {"zero nranks", [](json& x) { x["comms"][0][1] = 0; }},
      {"unknown comm index", [](json& x) { x["units"][0][2] = 7; }},
      {"zero count", [](json& x) { x["units"][0][3] = 0; }},
      {"odd unit", [](json& x) { x["units"][0].push_back(1); }},
      {"zero repeat", [](json& x) { x["units"][0][0] = 0; }},
      {"too many units", [](json& x) { x["units"][0][0] = std::uint64_t{1} << 21; }},
      {"negative iteration", [](json& x) { x["iteration"] = -3; }},
  };
  for (const auto& [what, f] : breaks) {
    json bad = j;
    f(bad);
    EXPECT_FALSE(ParseCutPattern(bad).ok()) << what;
  }

  // With channels: a pipeline communicator of 3 members, this rank comm rank 1 of it.
  CutPatternMessage ch = m;
  using analyzer::ChannelKind;
  ch.pattern.comms[0].rank = 1;
  ch.pattern.comms[0].channels = {{ChannelKind::kCollective, -1, 3}, {ChannelKind::kSend, 2, 40}, {ChannelKind::kRecv, 0, 41}};
  ch.pattern.units = {{true, {{0, 1, 1}, {0, 1, 2}}}, {false, {{1, 1, 0}}}, {true, {{0, 1, 2}, {0, 1, 1}}}};
  const json jc = CutPatternToJson(ch);
  ASSERT_TRUE(jc.contains("channels") && jc.contains("channel_units")) << jc.dump();
  EXPECT_EQ(jc["units"][0], json::parse("[1, 1, 0, 2]")) << "older readers get the unit's calls per comm";
  const auto chback = ParseCutPattern(jc);
  ASSERT_TRUE(chback.ok()) << chback.status().ToString();
  EXPECT_EQ(chback.value().pattern.comms[0].rank, 1);
  ASSERT_EQ(chback.value().pattern.comms[0].channels.size(), 3u);
  EXPECT_EQ(chback.value().pattern.comms[0].channels[2].kind, ChannelKind::kRecv);
  EXPECT_EQ(chback.value().pattern.comms[0].channels[2].base, 41u);
  EXPECT_EQ(chback.value().pattern.comms[1].rank, -1);
  ASSERT_EQ(chback.value().pattern.units.size(), 3u);
  EXPECT_EQ(chback.value().pattern.units[2].calls[0].channel, 2u);
  EXPECT_EQ(chback.value().pattern.units[2].calls[1].channel, 1u);
  json legacy = jc;  // what an older controller reads: the channels ignored
  legacy.erase("channels");
  legacy.erase("channel_units");
  const auto lback = ParseCutPattern(legacy);
  ASSERT_TRUE(lback.ok()) << lback.status().ToString();
  EXPECT_TRUE(lback.value().pattern.comms[0].channels.empty());
  EXPECT_EQ(lback.value().pattern.units[0].calls[0].count, 2u);
  const std::vector<std::pair<const char*, std::function<void(json&)>>> channel_breaks = {
      {"channels alone", [](json& x) { x.erase("channel_units"); }},
      {"channel units alone", [](json& x) { x.erase("channels"); }},
      {"one entry short", [](json& x) { x["channels"].erase(1); }},
      {"comm rank past nranks", [](json& x) { x["channels"][0][0] = 4; }},
      {"channels without a comm rank", [](json& x) { x["channels"][0][0] = -1; }},
      {"a comm rank without channels", [](json& x) { x["channels"][1][0] = 0; }},
      {"unknown kind", [](json& x) { x["channels"][0][1][1][0] = 3; }},
      {"send to itself", [](json& x) { x["channels"][0][1][1][1] = 1; }},
      {"send past nranks", [](json& x) { x["channels"][0][1][1][1] = 4; }},
      {"collective with a peer", [](json& x) { x["channels"][0][1][0][1] = 0; }},
      {"channel twice", [](json& x) { x["channels"][0][1][2] = x["channels"][0][1][1]; }},
      {"negative base", [](json& x) { x["channels"][0][1][0][2] = -1; }},
      {"unknown channel index", [](json& x) { x["channel_units"][0][3] = 3; }},
      {"channel of a comm without", [](json& x) { x["channel_units"][1][3] = 1; }},
      {"two-field entry", [](json& x) { x["channel_units"][1] = json::parse("[1, 0, 1, 1]"); }},
  };
  for (const auto& [what, f] : channel_breaks) {
    json bad = jc;
    f(bad);
    EXPECT_FALSE(ParseCutPattern(bad).ok()) << what << ": " << bad.dump();
  }

  // pause targets
  Command c;
  c.type = "pause";
  c.id = "p1";
  c.issued_ns = 1;
  c.max_pause_s = 5;
  c.targets = {{3, {{0xabc, 9, 9}, {0xdef, 80, 81}}}};
  const auto parsed = ParseCommand(ToJson(c).dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_EQ(parsed.value().targets.size(), 1u);
  EXPECT_EQ(parsed.value().targets[0].rank, 3);
  EXPECT_EQ(parsed.value().targets[0].targets[1].expect_seq, 81u);
  for (const char* t : {R"([{"rank": -1, "t": [["0000000000000abc", 1, 1]]}])", R"([{"rank": 1, "t": []}])",
                        R"([{"rank": 1, "t": [["0000000000000abc", 1]]}])", R"([{"rank": 1, "t": [["zz", 1, 1]]}])",
                        R"([{"rank": 1, "t": [["0000000000000abc", -1, 1]]}])", R"([{"t": [["0000000000000abc", 1, 1]]}])"}) {
    json bad = ToJson(c);
    bad["targets"] = json::parse(t);
    EXPECT_FALSE(ParseCommand(bad.dump()).ok()) << t;
  }
  json many = ToJson(c);
  many["targets"][0]["t"] = json::array();
  for (int i = 0; i < FALCON_PAUSE_MAX_TARGETS + 1; ++i) many["targets"][0]["t"].push_back({"0000000000000abc", 1, 1});
  EXPECT_FALSE(ParseCommand(many.dump()).ok()) << "more targets than a rank's control block holds";
}

TEST(ProtocolKeysTest, EveryPatternFormatsUnderTheJobNamespace) {
  std::set<std::string> seen;
  for (const KeySpec& k : kAllKeys) {
    const Result<std::string> key = FormatKey(k, {"job1", "node-a", 3});
    ASSERT_TRUE(key.ok()) << k.name << ": " << key.status().ToString();
    EXPECT_EQ(key.value().rfind("falcon:{job1}:", 0), 0u) << key.value();
    // The job is the only hash tag: no other brace, so Redis Cluster hashes every key on "job1".
    EXPECT_EQ(key.value().find_first_of("{}", std::string_view("falcon:{job1}").size()), std::string::npos)
        << key.value();
    EXPECT_TRUE(seen.insert(key.value()).second) << "two specs share " << key.value();
    for (std::string_view type : {k.messages}) {
      std::string_view rest = type;
      while (!rest.empty()) {  // every message named by a key is declared
        const auto bar = rest.find('|');
        EXPECT_NE(FindMessage(rest.substr(0, bar)), nullptr) << rest.substr(0, bar);
        rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
      }
    }
  }
  EXPECT_EQ(FormatKey(kRankKey, {"j", "h", 12}).value(), "falcon:{j}:rank:12");
  EXPECT_EQ(FormatKey(kCommandsStream, {"j", "h", {}}).value(), "falcon:{j}:commands:h");
  EXPECT_EQ(FormatKey(kAlertsChannel, {"j", "", {}}).value(), "falcon:{j}:alerts");
}

// A text too long for its field is cut to fit, never on a UTF-8 character, and says so; an
// incident whose summary listed thousands of hosts then still passes validation.
TEST(ProtocolTextTest, FitTextCutsOnACharacterBoundaryAndSaysSo) {
  EXPECT_EQ(FitText("short", 64), "short");
  const std::string exact(4096, 'x');
  EXPECT_EQ(FitText(exact, 4096), exact);
  std::string hosts;
  for (int h = 0; h < 4096; ++h) hosts += "node" + std::to_string(h) + ": no answer; ";
  for (const std::string& prefix : {std::string(), std::string("\xc3\xa9"), std::string("\xe2\x82\xac\xe2\x82\xac")}) {
    for (std::size_t pad = 0; pad < 4; ++pad) {  // the cut falls at each byte of a character
      std::string many;  // valid UTF-8 of 3-byte characters around the cut point
      for (int i = 0; i < 2000; ++i) many += "\xe2\x82\xac";
      const std::string in = prefix + std::string(pad, 'a') + many + hosts;
      const std::string out = FitText(in, 4096);
      EXPECT_LE(out.size(), 4096u);
      EXPECT_NE(out.find(" bytes, cut)"), std::string::npos);
      EXPECT_NO_THROW((void)nlohmann::json(out).dump()) << "a cut inside a character makes invalid UTF-8";
    }
  }
  nlohmann::json incident = {{"v", kSchemaVersion}, {"type", "incident"}, {"id", "inc-1"}, {"job", "j"},
                             {"stage", "localisation"}, {"at_ns", 1}, {"summary", FitText("validation did not complete: " + hosts, static_cast<std::size_t>(kMaxText))}};
  EXPECT_TRUE(ValidateMessage(incident, kIncident).ok()) << ValidateMessage(incident, kIncident).ToString();
  incident["summary"] = "validation did not complete: " + hosts;
  EXPECT_FALSE(ValidateMessage(incident, kIncident).ok()) << "the uncut summary is out of bounds";
}

TEST(ProtocolKeysTest, ValuesThatWouldChangeTheKeyAreRefused) {
  for (const char* bad : {"", "a:b", "a{b}", "a b", "a\nb", "a*"}) {
    EXPECT_FALSE(FormatKey(kAgentKey, {"job", bad, {}}).ok()) << bad;
    EXPECT_FALSE(FormatKey(kAgentKey, {bad, "host", {}}).ok()) << bad;
  }
  EXPECT_FALSE(FormatKey(kAgentKey, {std::string(129, 'a'), "h", {}}).ok());
  EXPECT_FALSE(FormatKey(kRankKey, {"j", "h", {}}).ok()) << "rank missing";
  EXPECT_FALSE(FormatKey(kRankKey, {"j", "h", -1}).ok()) << "negative rank";
  EXPECT_EQ(SanitizeKeyPart("node 1:a"), "node_1_a");
  EXPECT_EQ(SanitizeKeyPart(""), "_");
}

TEST(ProtocolCommandTest, PlanElementsAreRangeChecked) {
  json m = Example("plan");
  ASSERT_TRUE(ParseCommand(m.dump()).ok());
  EXPECT_EQ(ParseCommand(m.dump()).value().placement, (std::vector<std::int32_t>{1, 0, 2, 3}));
  for (auto [key, bad] : {std::pair{"micro_batches", 0}, {"micro_batches", 4097},
                          {"placement", -1}, {"placement", 65536}, {"exclude_nodes", -2}}) {
    json b = m;
    b[key] = json::array({1, bad});
    EXPECT_FALSE(ParseCommand(b.dump()).ok()) << key << " " << bad;
  }
}

// A stream keeps about stream_maxlen messages however they are packed: an entry's MAXLEN is the
// message budget divided by its messages, rounded up, never 0 (that would mean unbounded).
TEST(ProtocolPackTest, EntryCapCountsMessagesNotEntries) {
  EXPECT_EQ(EntryCap(100000, 1), 100000u);
  EXPECT_EQ(EntryCap(100000, 64), 1563u);
  EXPECT_EQ(EntryCap(100000, 0), 100000u);
  EXPECT_EQ(EntryCap(10, 64), 1u) << "a budget below one entry still keeps the entry";
  EXPECT_EQ(EntryCap(0, 64), 0u) << "0 stays unbounded";
}

// One validate command may carry a host's ranks, each with its own p2p peer (`peers`) or
// validation rank (`vrank_each`), paired with `ranks` by position; the lists replace the
// single-rank fields, and a list that cannot be paired is refused with the reason.
TEST(ProtocolCommandTest, PerRankPeersAndValidationRanksPairWithRanks) {
  json p2p = Example("validate");
  p2p.erase("peer");
  p2p["ranks"] = {4, 5, 6};
  p2p["peers"] = {9, 0, 3};
  const Result<Command> ok = ParseCommand(p2p.dump());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok.value().peers, (std::vector<std::int64_t>{9, 0, 3}));
  EXPECT_EQ(ToJson(ok.value())["peers"], p2p["peers"]) << "round trip";
  EXPECT_FALSE(ToJson(ok.value()).contains("peer"));
  EXPECT_EQ(PeerOf(ok.value(), 5), 0) << "rank 5's own entry";
  EXPECT_EQ(PeerOf(ok.value(), 7), std::nullopt) << "not one of ranks";
  EXPECT_EQ(PeerOf(ParseCommand(Example("validate").dump()).value(), 1), 1) << "the single-rank form";

  json join = p2p;
  join.erase("peers");
  join["task"] = "vcomm_join";
  join["blob"] = std::string(256, 'a');
  join["vranks"] = 8;
  join["bytes"] = 1024;
  join["vrank_each"] = {7, 0, 2};
  const Result<Command> joined = ParseCommand(join.dump());
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  EXPECT_EQ(joined.value().vrank_each, (std::vector<std::int64_t>{7, 0, 2}));
  EXPECT_EQ(VrankOf(joined.value(), 4), 7);
  EXPECT_EQ(VrankOf(joined.value(), 6), 2);

  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* why;  // in the error
  } cases[] = {
      {"peers shorter than ranks", [](json& j) { j["peers"] = {1, 2}; }, "one entry per rank"},
      {"peers without ranks", [](json& j) { j.erase("ranks"); }, "one entry per rank"},
      {"peers and peer", [](json& j) { j["peer"] = 1; }, "replaces peer and shift"},
      {"peers and shift", [](json& j) { j["shift"] = 1; }, "replaces peer and shift"},
      {"a rank twice", [](json& j) { j["ranks"] = {4, 5, 4}; }, "names a rank twice"},
      {"a negative peer", [](json& j) { j["peers"] = {1, -1, 2}; }, "peers"},
      {"vrank_each and vrank", [](json& j) { j["vrank_each"] = {1, 2, 3}; j["vrank"] = 1; }, "replaces vrank"},
      {"vrank_each past vranks", [](json& j) {
         j.erase("peers");
         j["task"] = "vcomm_join";
         j["blob"] = std::string(256, 'a');
         j["vranks"] = 8;
         j["bytes"] = 1024;
         j["vrank_each"] = {7, 8, 2};
       }, "vrank (or vrank_each) < vranks"},
  };
  for (const Case& c : cases) {
    json bad = p2p;
    c.edit(bad);
    const Result<Command> r = ParseCommand(bad.dump());
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_NE(r.status().message().find(c.why), std::string::npos) << c.what << ": " << r.status().message();
  }
}

// Every strategy a plan can carry is one an incident entry and the controller's state may name:
// a decision for the pipeline plan must be recordable (the controller checks the entry before it
// sends the plan, or it would send it again at every sample).
TEST(ProtocolStrategyTest, IncidentsAndControllerStateNameEveryPlanStrategy) {
  for (const char* strategy : {"S1", "S2", "S3", "S4", "pipeline"}) {
    json inc = Example(kIncident.type);
    inc["strategy"] = strategy;
    EXPECT_TRUE(ValidateMessage(inc, kIncident).ok()) << strategy;
    json st = Example(kControllerState.type);
    st["strategy"] = strategy;
    EXPECT_TRUE(ValidateMessage(st, kControllerState).ok()) << strategy;
    json plan = Example(kMitigationPlan.type);
    plan["strategy"] = strategy;
    if (std::string(strategy) == "pipeline") plan["warmup"] = {3, 2, 1, 0};
    EXPECT_TRUE(ValidateMessage(plan, kMitigationPlan).ok()) << strategy;
  }
  json inc = Example(kIncident.type);
  inc["strategy"] = "S5";
  EXPECT_FALSE(ValidateMessage(inc, kIncident).ok());
}

TEST(ProtocolCommandTest, InvalidCommandsKeepTheirIdentityForTheRejection) {
  json bad = Example("plan");
  bad["micro_batches"] = json::array({0});
  ASSERT_FALSE(ParseCommand(bad.dump()).ok());
  const auto id = SalvageCommandIdentity(bad.dump());
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(id->id, "cmd-1");
  EXPECT_EQ(id->type, "plan");
  for (const char* nameless : {"{not json", "[1,2]", R"({"type":"plan"})", R"({"id":"x","type":"alarm"})",
                               R"({"id":"","type":"plan"})", R"({"id":7,"type":"plan"})"}) {
    EXPECT_FALSE(SalvageCommandIdentity(nameless).has_value()) << nameless;
  }
  EXPECT_FALSE(SalvageCommandIdentity(json{{"id", std::string(65, 'a')}, {"type", "plan"}}.dump()).has_value());
}

TEST(ProtocolCommandTest, ParsesEachCommandTypeAndRejectsOthers) {
  for (const MessageSpec& spec : kCommands) {
    const Result<Command> c = ParseCommand(Example(spec.type).dump());
    ASSERT_TRUE(c.ok()) << spec.type << ": " << c.status().ToString();
    EXPECT_EQ(c.value().type, spec.type);
    EXPECT_EQ(c.value().id, "cmd-1");
    ASSERT_TRUE(c.value().ranks.has_value());
    EXPECT_EQ(c.value().ranks->size(), 2u);
  }
  const Result<Command> mode = ParseCommand(Example("set_mode").dump());
  EXPECT_EQ(mode.value().mode, "profile");
  // A report is not a command; a validate with a malformed communicator id is refused.
  EXPECT_FALSE(ParseCommand(Example("alarm").dump()).ok());
  json v = Example("validate");
  v["comm"] = "zzzzzzzzzzzzzzzz";
  EXPECT_FALSE(ParseCommand(v.dump()).ok());
  json big = Example("set_mode");
  big["sample_every"] = 0;
  EXPECT_FALSE(ParseCommand(big.dump()).ok());
  EXPECT_EQ(ParseCommIdHex("00000000000000ff").value(), 255u);
  EXPECT_EQ(CommIdHex(255), "00000000000000ff");
  EXPECT_FALSE(ParseCommIdHex("ff").has_value());
}

// The rank key / beat split (rank_beat.h). A rank of two communicators, as an agent sees it
// heartbeat after heartbeat.
RankRegistration Beating(std::int64_t at_ns, std::uint64_t calls) {
  RankRegistration m;
  m.header = {"job1", "node-a", at_ns};
  m.rank = 12;
  m.pid = 4242;
  m.started_ns = 1;
  m.comms = {{0xabcdef0123456789ull, 1, 4, "tp", calls}, {0x1111222233334444ull, 0, 2, "dp", calls / 2}};
  m.records = 3 * calls;
  m.iterations = calls / 10;
  return m;
}

// Written at the first heartbeat and when the content changes; otherwise only the counters move
// (in the beat, against the last write), until the TTL is two heartbeats from running out: then
// the same text again.
TEST(ProtocolRankBeatTest, TheKeyIsWrittenWhenItChangesAndRenewedUnchangedBeforeItsTtl) {
  constexpr std::int64_t kS = 1'000'000'000, kTtl = 10 * kS, kBeat = 2 * kS;
  RankKeyWriter w;
  RankBeat beat;
  ASSERT_TRUE(w.Next(Beating(100, 10), 0, kTtl, kBeat, beat));
  const std::string first = w.payload();
  EXPECT_EQ(first, ToJson(Beating(100, 10)).dump());
  EXPECT_EQ(beat.written_ns, 100);
  for (std::int64_t t = 1; t <= 2; ++t) {  // 2, 4 s: the TTL is more than two heartbeats away
    EXPECT_FALSE(w.Next(Beating(100 + t, 10 + t), t * kBeat, kTtl, kBeat, beat)) << t;
    EXPECT_EQ(beat.written_ns, 100);
    const auto calls = static_cast<std::uint64_t>(10 + t);
    EXPECT_EQ(beat.calls, (std::vector<std::uint64_t>{calls, calls / 2}));
    EXPECT_EQ(beat.records, 3 * calls);
  }
  ASSERT_TRUE(w.Next(Beating(103, 13), 3 * kBeat, kTtl, kBeat, beat));  // 6 s: two heartbeats left, renewed
  EXPECT_EQ(w.payload(), first);
  EXPECT_EQ(beat.written_ns, 100);
  EXPECT_EQ(beat.calls.front(), 13u);
  EXPECT_FALSE(w.Next(Beating(104, 14), 4 * kBeat, kTtl, kBeat, beat));  // counted from the renewal
  EXPECT_FALSE(w.Next(Beating(105, 15), 5 * kBeat, kTtl, kBeat, beat));
  RankRegistration slow = Beating(106, 16);
  slow.slow = true;
  ASSERT_TRUE(w.Next(slow, 6 * kBeat, kTtl, kBeat, beat));  // content changed: written at once
  EXPECT_EQ(w.payload(), ToJson(slow).dump());
  EXPECT_EQ(beat.written_ns, 106);
  RankRegistration comm = slow;
  comm.comms.push_back({0x5555666677778888ull, 0, 8, "pp", 0});
  comm.header.at_ns = 107;
  EXPECT_TRUE(w.Next(comm, 7 * kBeat, kTtl, kBeat, beat)) << "a new communicator is new content";
  EXPECT_EQ(beat.calls.size(), 3u);
  // A TTL shorter than two heartbeats: every heartbeat writes, as before the split.
  RankKeyWriter tight;
  for (std::int64_t t = 0; t < 3; ++t) EXPECT_TRUE(tight.Next(Beating(100, 10), t * kBeat, 3 * kS, kBeat, beat));
}

// A key's content with its beat is what the key would hold had it been rewritten with every
// heartbeat; a beat for another content, host or set of communicators is not applied.
TEST(ProtocolRankBeatTest, ABeatOnItsContentGivesTheFullRegistrationAndOnlyThere) {
  constexpr std::int64_t kS = 1'000'000'000;
  RankKeyWriter w;
  RankBeat beat;
  ASSERT_TRUE(w.Next(Beating(100, 10), 0, 10 * kS, 2 * kS, beat));
  const json key = json::parse(w.payload());
  RankRegistration now = Beating(500, 77);
  now.excluded = 4;
  ASSERT_FALSE(w.Next(now, 2 * kS, 10 * kS, 2 * kS, beat));
  AgentHeartbeat h;
  h.header = {"job1", "node-a", 500};
  h.pid = 7;
  h.version = "0.1.0";
  h.ranks = {12};
  h.beats = {{beat}};
  const json agent = ToJson(h);
  ASSERT_TRUE(ValidateMessage(agent, kAgentHeartbeat).ok());
  const json& b = agent["beats"][0];

  json merged = key;
  ASSERT_TRUE(ApplyBeat(merged, b, "node-a", 500));
  EXPECT_EQ(merged, ToJson(now));
  EXPECT_TRUE(ValidateMessage(merged, kRankRegister).ok());
  json back = merged;  // a later beat without `excluded` takes it away again
  json b2 = b;
  b2.erase("excluded");
  b2["written_ns"] = 500;
  ASSERT_TRUE(ApplyBeat(back, b2, "node-a", 600));
  EXPECT_FALSE(back.contains("excluded"));

  json other = key;
  EXPECT_FALSE(ApplyBeat(other, b, "node-b", 500)) << "another host's beat";
  json stale = b;
  stale["written_ns"] = 99;
  EXPECT_FALSE(ApplyBeat(other, stale, "node-a", 500)) << "counters of another content";
  json fewer = b;
  fewer["calls"] = json::array({1});
  EXPECT_FALSE(ApplyBeat(other, fewer, "node-a", 500)) << "another set of communicators";
  json rank = b;
  rank["rank"] = 13;
  EXPECT_FALSE(ApplyBeat(other, rank, "node-a", 500));
  EXPECT_EQ(other, key) << "left as it was";

  // A whole job: each rank given its own host's beat, a rank without one left as it is.
  std::vector<json> ranks = {key, ToJson(Beating(50, 1))};
  ranks[1]["rank"] = 30;
  const json untouched = ranks[1];
  AgentHeartbeat elsewhere = h;
  elsewhere.header.host = "node-b";
  elsewhere.beats->front().calls = {1, 1};
  ApplyBeats(ranks, {ToJson(elsewhere), agent});
  EXPECT_EQ(ranks[0], ToJson(now));
  EXPECT_EQ(ranks[1], untouched);
}

}  // namespace
}  // namespace falcon::protocol
