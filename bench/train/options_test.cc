// Tests of the option table: parsing, bounds, defaults and --help.
#include "options.h"

#include <gtest/gtest.h>

#include <vector>

namespace falcon::train {
namespace {

Result<Options> Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "falcon-train-emu");
  return ParseOptions(static_cast<int>(args.size()), args.data());
}

TEST(OptionsTest, Defaults) {
  const Result<Options> o = Parse({});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o.value().micro_batches, 4);
  EXPECT_EQ(o.value().layers, 2);
  EXPECT_EQ(o.value().iters, Options::kDefaultIters);
  EXPECT_EQ(o.value().ActivationBytes(), 2u * 64 * 128 * 2);
  EXPECT_EQ(o.value().GradBytes(), 2u * 12 * 128 * 128 * 2);
  EXPECT_EQ(o.value().StateBytes(), 8 * o.value().GradBytes());
  EXPECT_FALSE(o.value().falcon_plans);
  EXPECT_EQ(o.value().checkpoint_every, 10);
  EXPECT_DOUBLE_EQ(o.value().restart_s, 5);
  EXPECT_EQ(o.value().spare_nodes, 0);
}

TEST(OptionsTest, MitigationFlags) {
  const Result<Options> o = Parse({"--falcon-plans", "--checkpoint-every", "3", "--restart-s", "0.25", "--spare-nodes",
                                   "2", "--state-bytes", "1000"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_TRUE(o.value().falcon_plans);
  EXPECT_EQ(o.value().checkpoint_every, 3);
  EXPECT_DOUBLE_EQ(o.value().restart_s, 0.25);
  EXPECT_EQ(o.value().spare_nodes, 2);
  EXPECT_EQ(o.value().StateBytes(), 1000u);
}

TEST(OptionsTest, ParsesEveryKind) {
  const Result<Options> o = Parse({"--tp", "2", "--dp=3", "--pp", "4", "--compute-ms", "0.5", "--dp-mode", "rs-ag",
                                   "--check", "--report", "r-{rank}.json", "--duration-s", "3", "--grad-bytes",
                                   "4096", "--plan-file", "/tmp/p.json"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o.value().shape.tp, 2);
  EXPECT_EQ(o.value().shape.dp, 3);
  EXPECT_EQ(o.value().shape.pp, 4);
  EXPECT_DOUBLE_EQ(o.value().compute_ms, 0.5);
  EXPECT_EQ(o.value().dp_mode, DpMode::kReduceScatterAllGather);
  EXPECT_TRUE(o.value().check);
  EXPECT_EQ(o.value().iters, 0);  // --duration-s alone: run by time
  EXPECT_EQ(o.value().GradBytes(), 4096u);
  EXPECT_EQ(o.value().plan_file, "/tmp/p.json");
}

TEST(OptionsTest, ModesAndTheirDefaults) {
  const Result<Options> def = Parse({});
  ASSERT_TRUE(def.ok());
  EXPECT_FALSE(def.value().world_sync);
  EXPECT_TRUE(def.value().watchdog);
  EXPECT_EQ(def.value().dp_mode, DpMode::kReduceScatterAllGather);  // the distributed optimizer
  const Result<Options> legacy = Parse({"--world-sync"});
  ASSERT_TRUE(legacy.ok());
  EXPECT_TRUE(legacy.value().world_sync);
  EXPECT_EQ(legacy.value().dp_mode, DpMode::kAllReduce);
  const Result<Options> ar = Parse({"--dp-mode", "allreduce", "--lazy-init", "--nonblocking", "--no-watchdog",
                                    "--checkpoint-save-ms", "5"});
  ASSERT_TRUE(ar.ok()) << ar.status().ToString();
  EXPECT_EQ(ar.value().dp_mode, DpMode::kAllReduce);
  EXPECT_TRUE(ar.value().lazy_init);
  EXPECT_TRUE(ar.value().nonblocking);
  EXPECT_FALSE(ar.value().watchdog);
  EXPECT_DOUBLE_EQ(ar.value().checkpoint_save_ms, 5);
  const Result<Options> bad = Parse({"--world-sync", "--lazy-init"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not with --world-sync"), std::string::npos);
}

TEST(OptionsTest, RejectsBadInput) {
  struct Case { std::vector<const char*> args; const char* says; };
  for (const Case& c : {Case{{"--bogus"}, "unknown option --bogus"}, Case{{"--tp"}, "needs a value"},
                        Case{{"--tp", "0"}, "--tp: 0 is outside"}, Case{{"--tp", "two"}, "not an integer"},
                        Case{{"--dp-mode", "ring"}, "not allreduce or rs-ag"}, Case{{"--check=1"}, "takes no value"},
                        Case{{"--compute-ms", "-1"}, "outside"}, Case{{"--grad-bytes", "-5"}, "not a byte count"},
                        Case{{"--checkpoint-every", "0"}, "outside"}, Case{{"--spare-nodes", "-1"}, "outside"},
                        Case{{"--falcon-plans", "--plan-file", "p.json"}, "alternatives"}}) {
    const Result<Options> o = Parse(c.args);
    ASSERT_FALSE(o.ok()) << c.says;
    EXPECT_NE(o.status().message().find(c.says), std::string::npos) << o.status().message();
  }
}

TEST(OptionsTest, FaultInjections) {
  const Result<Options> mm = Parse({"--tp", "2", "--dp", "2", "--inject-mismatch", "3:5:dtype:dp", "--inject-swap", "0:1",
                                    "--pp", "2"});
  ASSERT_TRUE(mm.ok()) << mm.status().ToString();
  EXPECT_EQ(mm.value().mismatch_rank, 3);
  EXPECT_EQ(mm.value().mismatch_iter, 5);
  EXPECT_EQ(mm.value().mismatch_kind, MismatchKind::kDtype);
  EXPECT_EQ(mm.value().mismatch_group, InjectGroup::kDp);
  EXPECT_EQ(mm.value().swap_rank, 0);
  EXPECT_EQ(mm.value().swap_iter, 1);
  const Result<Options> tp = Parse({"--tp", "2", "--inject-mismatch", "1:0:count"});
  ASSERT_TRUE(tp.ok()) << tp.status().ToString();
  EXPECT_EQ(tp.value().mismatch_kind, MismatchKind::kCount);
  EXPECT_EQ(tp.value().mismatch_group, InjectGroup::kTp);  // the default
  const Result<Options> off = Parse({});
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off.value().mismatch_rank, -1);
  EXPECT_EQ(off.value().swap_rank, -1);
}

TEST(OptionsTest, RejectsInjectionsTheShapeCannotHost) {
  struct Case { std::vector<const char*> args; const char* says; };
  for (const Case& c : {
           Case{{"--tp", "2", "--inject-mismatch", "1:2"}, "expected RANK:ITER:KIND[:GROUP]"},
           Case{{"--tp", "2", "--inject-mismatch", "1:2:size"}, "KIND: 'size' is not count or dtype"},
           Case{{"--tp", "2", "--inject-mismatch", "1:2:count:pp"}, "GROUP: 'pp' is not tp or dp"},
           Case{{"--tp", "2", "--inject-mismatch", "x:2:count"}, "RANK: 'x' is not an integer"},
           Case{{"--tp", "2", "--inject-mismatch", "2:0:count"}, "rank 2 is not in this 2x1x1 job of 2 ranks"},
           Case{{"--dp", "2", "--inject-mismatch", "0:0:count"}, "the tp group has one rank"},
           Case{{"--tp", "2", "--inject-mismatch", "0:0:dtype:dp"}, "the dp group has one rank"},
           Case{{"--tp", "2", "--world-sync", "--inject-mismatch", "0:0:count"}, "not with --world-sync"},
           Case{{"--pp", "2", "--inject-swap", "1"}, "expected RANK:ITER"},
           Case{{"--pp", "2", "--inject-swap", "2:0"}, "rank 2 is not in this"},
           Case{{"--tp", "2", "--inject-swap", "0:0"}, "has no embedding group"},
           Case{{"--pp", "3", "--inject-swap", "1:0"}, "has no embedding group"},  // a middle stage
           Case{{"--pp", "2", "--world-sync", "--inject-swap", "0:0"}, "not with --world-sync"}}) {
    const Result<Options> o = Parse(c.args);
    ASSERT_FALSE(o.ok()) << c.says;
    EXPECT_NE(o.status().message().find(c.says), std::string::npos) << o.status().message();
  }
}

// --split-backward runs its traffic per direction: refused where the exchanges are batched.
TEST(OptionsTest, SplitBackwardNeedsPerDirectionTrafficInAPipeline) {
  const Result<Options> ok = Parse({"--pp", "2", "--pp-comm", "per-direction", "--split-backward"});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(ok.value().split_backward);
  EXPECT_TRUE(Parse({"--dp", "2", "--split-backward"}).ok());  // no pipeline: no traffic to pair
  EXPECT_FALSE(Parse({}).value().split_backward);
  struct Case { std::vector<const char*> args; const char* says; };
  for (const Case& c : {Case{{"--pp", "2", "--split-backward"}, "needs --pp-comm per-direction when pp > 1"},
                        Case{{"--world-sync", "--split-backward"}, "not with --world-sync"},
                        Case{{"--split-backward=1"}, "takes no value"}}) {
    const Result<Options> o = Parse(c.args);
    ASSERT_FALSE(o.ok()) << c.says;
    EXPECT_NE(o.status().message().find(c.says), std::string::npos) << o.status().message();
  }
}

TEST(OptionsTest, HelpListsEveryOption) {
  const std::string help = UsageText();
  for (const char* flag : {"--tp", "--dp", "--pp", "--micro-batches", "--layers", "--hidden", "--seq",
                           "--micro-batch-size", "--compute-ms", "--optimizer-ms", "--grad-bytes", "--dp-mode",
                           "--iters", "--duration-s", "--check", "--report", "--progress-every", "--plan-file",
                           "--falcon-plans", "--checkpoint-every", "--restart-s", "--spare-nodes", "--state-bytes",
                           "--inject-stall", "--inject-mismatch", "--inject-swap", "--pp-comm",
                           "--activation-limit", "--split-backward"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  }
  const Result<Options> o = Parse({"-h"});
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o.value().help);
}

}  // namespace
}  // namespace falcon::train
