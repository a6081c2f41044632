// The progress document (progress_json.h): a round trip keeps every field, and every malformed
// document is refused with the path of its first bad value (the message falcon-ctl hang prints).
#include "daemon/shm/progress_json.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace falcon::daemon {
namespace {

using analyzer::CommProgress;
using analyzer::IssuedCall;
using analyzer::RankProgress;
using nlohmann::json;

std::vector<RankProgress> SampleRanks() {
  RankProgress r0;
  r0.rank = 0;
  r0.host = "node-0";
  r0.comms = {CommProgress{0x00000000000000abULL, 4, 0, 12, 11, true, "default_pg"},
              CommProgress{0xfedcba9876543210ULL, 2, 0, 3, 1, false, "pp 0<->1"}};
  IssuedCall all_reduce;
  all_reduce.comm = 0xab;
  all_reduce.seq = 11;
  all_reduce.sig = {1 /*AllReduce*/, 9 /*bfloat16*/, 0 /*sum*/, -1, 4096};
  all_reduce.stream = 0x7f00deadbeefULL;
  all_reduce.completed = false;
  all_reduce.issue_ns = 1700000000123456789LL;
  IssuedCall send;
  send.comm = 0xfedcba9876543210ULL;
  send.seq = 2;
  send.sig = {10 /*Send*/, 0xFF, -1, 1, 17};
  send.completed = true;
  send.group = 3;
  r0.recent = {send, all_reduce};
  r0.in_call = 0xabULL;
  RankProgress r1;
  r1.rank = 1;
  r1.comms = {CommProgress{0xab, 4, 1, 11, 11, true, ""}};
  return {r0, r1};
}

void ExpectSameRanks(const std::vector<RankProgress>& got, const std::vector<RankProgress>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("rank index " + std::to_string(i));
    EXPECT_EQ(got[i].rank, want[i].rank);
    EXPECT_EQ(got[i].host, want[i].host);
    EXPECT_EQ(got[i].in_call, want[i].in_call);
    ASSERT_EQ(got[i].comms.size(), want[i].comms.size());
    for (std::size_t c = 0; c < got[i].comms.size(); ++c) {
      EXPECT_EQ(got[i].comms[c].comm, want[i].comms[c].comm);
      EXPECT_EQ(got[i].comms[c].nranks, want[i].comms[c].nranks);
      EXPECT_EQ(got[i].comms[c].comm_rank, want[i].comms[c].comm_rank);
      EXPECT_EQ(got[i].comms[c].issued, want[i].comms[c].issued);
      EXPECT_EQ(got[i].comms[c].completed, want[i].comms[c].completed);
      EXPECT_EQ(got[i].comms[c].completion_known, want[i].comms[c].completion_known);
      EXPECT_EQ(got[i].comms[c].name, want[i].comms[c].name);
    }
    ASSERT_EQ(got[i].recent.size(), want[i].recent.size());
    for (std::size_t c = 0; c < got[i].recent.size(); ++c) {
      EXPECT_EQ(got[i].recent[c].comm, want[i].recent[c].comm);
      EXPECT_EQ(got[i].recent[c].seq, want[i].recent[c].seq);
      EXPECT_EQ(got[i].recent[c].sig, want[i].recent[c].sig);
      EXPECT_EQ(got[i].recent[c].stream, want[i].recent[c].stream);
      EXPECT_EQ(got[i].recent[c].completed, want[i].recent[c].completed);
      EXPECT_EQ(got[i].recent[c].group, want[i].recent[c].group);
      EXPECT_EQ(got[i].recent[c].issue_ns, want[i].recent[c].issue_ns);
    }
  }
}

TEST(ProgressJsonTest, RoundTripKeepsEveryField) {
  const std::vector<RankProgress> ranks = SampleRanks();
  const json doc = ProgressToJson(ranks, "shm");
  EXPECT_EQ(doc["format"], "falcon-progress");
  EXPECT_EQ(doc["version"], kProgressFormatVersion);
  EXPECT_EQ(doc["ranks"][0]["comms"][1]["comm"], "fedcba9876543210");
  EXPECT_EQ(doc["ranks"][0]["recent"][1]["op"], "AllReduce");
  EXPECT_EQ(doc["ranks"][0]["recent"][1]["dtype"], "bfloat16");
  EXPECT_EQ(doc["ranks"][0]["recent"][1]["redop"], "sum");
  EXPECT_TRUE(doc["ranks"][0]["recent"][0]["dtype"].is_null());
  EXPECT_TRUE(doc["ranks"][0]["recent"][0]["stream"].is_null());
  EXPECT_TRUE(doc["ranks"][1]["in_call"].is_null());

  std::string error;
  // Through text, as falcon-ctl reads it from a file or the converter's pipe.
  const auto parsed = ParseProgress(json::parse(doc.dump()), &error);
  ASSERT_TRUE(parsed.has_value()) << error;
  EXPECT_EQ(parsed->source, "shm");
  ExpectSameRanks(parsed->ranks, ranks);
}

// One rank alone, as a progress command's ack carries it: parsed like a document's element.
TEST(ProgressJsonTest, OneRankParsesAloneAndItsErrorsNameTheirPath) {
  const std::vector<RankProgress> ranks = SampleRanks();
  const json doc = ProgressToJson(ranks, "shm");
  std::string error;
  const auto one = ParseProgressRank(doc["ranks"][1], &error);
  ASSERT_TRUE(one.has_value()) << error;
  ExpectSameRanks({*one}, {ranks[1]});
  json bad = doc["ranks"][0];
  bad["comms"][1]["issued"] = -1;
  EXPECT_FALSE(ParseProgressRank(bad, &error).has_value());
  EXPECT_EQ(error.rfind("rank.comms[1].issued", 0), 0u) << error;
  EXPECT_FALSE(ParseProgressRank(json::array(), &error).has_value());
}

TEST(ProgressJsonTest, OptionalFieldsTakeTheirDefaultsAndUnknownKeysAreIgnored) {
  const json doc = json::parse(R"({
    "format": "falcon-progress", "version": 1, "missing_ranks": [3], "added_later": {"x": 1},
    "ranks": [{"rank": 2, "comms": [{"comm": "0xAB", "nranks": 4, "comm_rank": 2, "issued": 5, "completed": 4}],
               "recent": [{"comm": "ab", "seq": 4, "op": "Recv", "count": 8, "dtype": null, "redop": null,
                           "stream": null, "future_key": true}]}]})");
  std::string error;
  const auto parsed = ParseProgress(doc, &error);
  ASSERT_TRUE(parsed.has_value()) << error;
  EXPECT_EQ(parsed->source, "");
  ASSERT_EQ(parsed->ranks.size(), 1u);
  const RankProgress& r = parsed->ranks[0];
  EXPECT_EQ(r.host, "");
  EXPECT_FALSE(r.in_call.has_value());
  EXPECT_EQ(r.comms[0].comm, 0xabu);
  EXPECT_EQ(r.comms[0].name, "");
  EXPECT_TRUE(r.comms[0].completion_known);
  ASSERT_EQ(r.recent.size(), 1u);
  EXPECT_EQ(r.recent[0].sig.op, 11);  // Recv
  EXPECT_EQ(r.recent[0].sig.dtype, 0xFF);
  EXPECT_EQ(r.recent[0].sig.redop, -1);
  EXPECT_EQ(r.recent[0].sig.peer, -1);
  EXPECT_EQ(r.recent[0].stream, 0u);
  EXPECT_FALSE(r.recent[0].completed);
  EXPECT_EQ(r.recent[0].issue_ns, 0);
}

// One valid document, then each case breaks one value and names the error it must give.
TEST(ProgressJsonTest, EveryMalformedDocumentNamesItsFirstBadValue) {
  const json good = ProgressToJson(SampleRanks(), "flight-recorder");
  struct Case {
    const char* what;
    void (*edit)(json&);
    const char* error;
  } cases[] = {
      {"not an object", [](json& d) { d = json::array(); }, "document: expected a JSON object"},
      {"wrong format", [](json& d) { d["format"] = "falcon-records"; }, "format: expected \"falcon-progress\""},
      {"no format", [](json& d) { d.erase("format"); }, "format: expected \"falcon-progress\""},
      {"newer version", [](json& d) { d["version"] = 2; },
       "version: 2 is newer than this falcon-ctl reads (1)"},
      {"version zero", [](json& d) { d["version"] = 0; }, "version: out of range [1, 2147483647]"},
      {"no version", [](json& d) { d.erase("version"); }, "document.version: missing"},
      {"no ranks", [](json& d) { d.erase("ranks"); }, "document.ranks: missing"},
      {"ranks not an array", [](json& d) { d["ranks"] = json::object(); }, "document.ranks: expected an array"},
      {"rank not an object", [](json& d) { d["ranks"][1] = 7; }, "ranks[1]: expected an object"},
      {"missing rank", [](json& d) { d["ranks"][0].erase("rank"); }, "ranks[0].rank: missing"},
      {"negative rank", [](json& d) { d["ranks"][0]["rank"] = -1; },
       "ranks[0].rank: out of range [0, 9223372036854775807]"},
      {"missing comms", [](json& d) { d["ranks"][1].erase("comms"); }, "ranks[1].comms: missing"},
      {"missing issued", [](json& d) { d["ranks"][0]["comms"][1].erase("issued"); },
       "ranks[0].comms[1].issued: missing"},
      {"negative issued", [](json& d) { d["ranks"][0]["comms"][0]["issued"] = -3; },
       "ranks[0].comms[0].issued: expected a non-negative integer"},
      {"fractional completed", [](json& d) { d["ranks"][0]["comms"][0]["completed"] = 1.5; },
       "ranks[0].comms[0].completed: expected a non-negative integer"},
      {"completed above issued", [](json& d) { d["ranks"][0]["comms"][0]["completed"] = 13; },
       "ranks[0].comms[0].completed: exceeds issued (12)"},
      {"comm_rank not below nranks", [](json& d) { d["ranks"][0]["comms"][1]["comm_rank"] = 2; },
       "ranks[0].comms[1].comm_rank: must be below nranks (2)"},
      {"zero nranks", [](json& d) { d["ranks"][0]["comms"][1]["nranks"] = 0; },
       "ranks[0].comms[1].nranks: out of range [1, 2147483647]"},
      {"bad hex comm", [](json& d) { d["ranks"][0]["comms"][0]["comm"] = "00xyz"; },
       "ranks[0].comms[0].comm: expected up to 16 hex digits, got \"00xyz\""},
      {"hex too long", [](json& d) { d["ranks"][0]["comms"][0]["comm"] = "10000000000000000"; },
       "ranks[0].comms[0].comm: expected up to 16 hex digits, got \"10000000000000000\""},
      {"empty hex", [](json& d) { d["ranks"][0]["comms"][0]["comm"] = "0x"; },
       "ranks[0].comms[0].comm: expected up to 16 hex digits, got \"0x\""},
      {"comm not a string", [](json& d) { d["ranks"][0]["comms"][0]["comm"] = 171; },
       "ranks[0].comms[0].comm: expected a string"},
      {"bad hex in_call", [](json& d) { d["ranks"][0]["in_call"] = "g"; },
       "ranks[0].in_call: expected up to 16 hex digits, got \"g\""},
      {"recent not an array", [](json& d) { d["ranks"][0]["recent"] = "x"; }, "ranks[0].recent: expected an array"},
      {"unknown op", [](json& d) { d["ranks"][0]["recent"][1]["op"] = "all_reduce"; },
       "ranks[0].recent[1].op: unknown op \"all_reduce\" (expected an NCCL call name such as AllReduce or Send)"},
      {"unknown dtype", [](json& d) { d["ranks"][0]["recent"][1]["dtype"] = "Float"; },
       "ranks[0].recent[1].dtype: unknown dtype \"Float\" (expected int8 ... float8e5m2, as in the call-record dump)"},
      {"unknown redop", [](json& d) { d["ranks"][0]["recent"][1]["redop"] = "mean"; },
       "ranks[0].recent[1].redop: unknown redop \"mean\" (expected sum, prod, max, min, avg or premulsum)"},
      {"missing seq", [](json& d) { d["ranks"][0]["recent"][0].erase("seq"); }, "ranks[0].recent[0].seq: missing"},
      {"missing count", [](json& d) { d["ranks"][0]["recent"][0].erase("count"); },
       "ranks[0].recent[0].count: missing"},
      {"peer below -1", [](json& d) { d["ranks"][0]["recent"][0]["peer"] = -2; },
       "ranks[0].recent[0].peer: out of range [-1, 2147483647]"},
      {"completed not a bool", [](json& d) { d["ranks"][0]["recent"][0]["completed"] = 1; },
       "ranks[0].recent[0].completed: expected true or false"},
      {"negative issue_ns", [](json& d) { d["ranks"][0]["recent"][0]["issue_ns"] = -5; },
       "ranks[0].recent[0].issue_ns: out of range [0, 9223372036854775807]"},
      {"host not a string", [](json& d) { d["ranks"][0]["host"] = 3; }, "ranks[0].host: expected a string"},
      {"source not a string", [](json& d) { d["source"] = false; }, "source: expected a string"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    json doc = good;
    c.edit(doc);
    std::string error = "unset";
    EXPECT_FALSE(ParseProgress(doc, &error).has_value());
    EXPECT_EQ(error, c.error);
  }
  std::string error;
  EXPECT_TRUE(ParseProgress(good, &error).has_value()) << error;  // the edits above were all it took
}

}  // namespace
}  // namespace falcon::daemon
