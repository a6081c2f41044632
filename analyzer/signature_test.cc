// Tests for call signatures: op parsing, size classes, hashing and interning.
#include "analyzer/signature.h"

#include <gtest/gtest.h>

namespace falcon::analyzer {
namespace {

TEST(SignatureTest, ParsesCollectivesAndRejectsManagementCalls) {
  struct Case {
    const char* name;
    OpKind kind;
  };
  const Case cases[] = {
      {"AllReduce", OpKind::kAllReduce},   {"ncclAllReduce", OpKind::kAllReduce},
      {"Bcast", OpKind::kBroadcast},       {"Send", OpKind::kSend},
      {"Recv", OpKind::kRecv},             {"ReduceScatter", OpKind::kReduceScatter},
      {"GroupStart", OpKind::kOther},      {"CommInitRank", OpKind::kOther},
      {"GetUniqueId", OpKind::kOther},     {"", OpKind::kOther},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ParseOpKind(c.name), c.kind) << c.name;
  }
}

TEST(SignatureTest, SizeClassesGroupPowersOfTwo) {
  EXPECT_EQ(SizeClass(0), 0U);
  EXPECT_EQ(SizeClass(1), 1U);
  EXPECT_EQ(SizeClass(4096), SizeClass(8191));
  EXPECT_NE(SizeClass(4096), SizeClass(8192));
}

TEST(SignatureTest, HashDistinguishesEachField) {
  const CallRecord base{OpKind::kAllReduce, 0x1234, 1 << 20, -1, 0};
  CallRecord other = base;
  other.t_ns = 99;  // time is not part of the signature
  EXPECT_EQ(SignatureHash(base), SignatureHash(other));
  for (int field = 0; field < 4; ++field) {
    other = base;
    if (field == 0) other.op = OpKind::kAllGather;
    if (field == 1) other.comm = 0x1235;
    if (field == 2) other.bytes = 1 << 22;
    if (field == 3) other.peer = 3;
    EXPECT_NE(SignatureHash(base), SignatureHash(other)) << "field " << field;
  }
}

TEST(SignatureTest, SequenceSkipsManagementCallsAndInternsInOrder) {
  const CallRecord calls[] = {
      {OpKind::kOther, 0, 0, -1, 1},      {OpKind::kAllReduce, 1, 64, -1, 2},
      {OpKind::kSend, 1, 64, 2, 3},       {OpKind::kAllReduce, 1, 64, -1, 4},
  };
  SignatureTable table;
  const SignatureSequence seq = MakeSignatureSequence(calls, table);
  ASSERT_EQ(seq.symbols.size(), 3U);
  EXPECT_EQ(seq.symbols[0], 0U);
  EXPECT_EQ(seq.symbols[1], 1U);
  EXPECT_EQ(seq.symbols[2], 0U);
  EXPECT_EQ(seq.t_ns[2], 4);
  EXPECT_EQ(table.size(), 2U);
}

}  // namespace
}  // namespace falcon::analyzer
