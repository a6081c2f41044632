// The plan block (shm_abi.h contract 7) and the C API for frameworks (include/falcon/falcon.h):
//  - in-process, the agent's writer (daemon/shm/plan_block.h) against the shim's own reader
//    (shim/plan_reader.h) on one block: every field round-trips, oversized plans are refused
//    whole, acks keep the highest versions, a writer that died mid-write is taken over, and a
//    writer hammering the block while readers copy it never yields a mixed plan (the sanitizer
//    builds see both sides here);
//  - across processes, the real libfalcon_shim.so in falcon-test-plan (tests/progs/plan_prog.cc):
//    no plan before the first NCCL call or while passing through, NULL arguments refused, every
//    getter returns the plan the test writes into the live segment, capacity truncation, the
//    ack reaches the segment, and concurrent writes from this process never show up mixed.
// Waits are conditions with deadlines, never fixed sleeps.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon/shm/plan_block.h"
#include "daemon/shm/segment_dir.h"
#include "daemon/shm/segment_reader.h"
#include "shim/plan_reader.h"
#include "tests/support/plan_pattern.h"
#include "tests/support/subprocess.h"

namespace falcon {
namespace {

using daemon::ShmPlan;
using shim::PlanPart;
using testing::PatternCount;
using testing::PatternValue;

constexpr PlanPart kParts[] = {PlanPart::kMicroBatches, PlanPart::kPlacement, PlanPart::kExcludedNodes,
                               PlanPart::kWarmup};

ShmPlan PatternPlan(uint32_t version) {
  ShmPlan p;
  p.version = version;
  p.strategy = testing::PatternStrategy(version);
  p.restart = testing::PatternRestart(version) != 0;
  p.issued_real_ns = testing::PatternIssuedNs(version);
  std::vector<int32_t>* parts[] = {&p.micro_batches, &p.placement, &p.exclude_nodes};
  for (uint32_t part = 0; part < 3; ++part) {
    for (uint32_t i = 0; i < PatternCount(version, part); ++i) parts[part]->push_back(PatternValue(version, part, i));
  }
  return p;
}

ShmPlan SmallPlan() {
  ShmPlan p;
  p.version = 3;
  p.strategy = kFalconStrategyRestart;
  p.restart = true;
  p.issued_real_ns = 12345;
  p.micro_batches = {4, 4, 2, 6};
  p.placement = {0, 0, 1, 1, 2};
  p.exclude_nodes = {2};
  p.warmup = {3, 3, 1, 0};
  return p;
}

std::unique_ptr<FalconPlanBlock> FreshBlock() { return std::make_unique<FalconPlanBlock>(); }  // zeroed

TEST(PlanBlockTest, EveryFieldRoundTripsAndOversizedPlansAreRefusedWhole) {
  auto block = FreshBlock();
  FalconPlanInfo info;
  EXPECT_EQ(shim::ReadPlanInfo(*block, &info), FALCON_ERR_NO_PLAN);
  EXPECT_EQ(info.version, 0u);
  uint32_t version = 9;
  EXPECT_EQ(shim::ReadPlanPart(*block, PlanPart::kMicroBatches, nullptr, 0, &version), FALCON_ERR_NO_PLAN);
  EXPECT_EQ(version, 0u);
  ShmPlan copy;
  EXPECT_EQ(daemon::ReadPlanBlock(*block, &copy).code(), Status::Code::kNotFound);

  struct Oversize {
    std::vector<int32_t> ShmPlan::*array;
    size_t n;
    const char* macro;
  };
  for (const Oversize& o : {Oversize{&ShmPlan::micro_batches, FALCON_PLAN_MAX_MICRO_BATCHES + 1, "FALCON_PLAN_MAX_MICRO_BATCHES"},
                            Oversize{&ShmPlan::placement, FALCON_PLAN_MAX_PLACEMENT + 1, "FALCON_PLAN_MAX_PLACEMENT"},
                            Oversize{&ShmPlan::exclude_nodes, FALCON_PLAN_MAX_EXCLUDE + 1, "FALCON_PLAN_MAX_EXCLUDE"},
                            Oversize{&ShmPlan::warmup, FALCON_PLAN_MAX_STAGES + 1, "FALCON_PLAN_MAX_STAGES"}}) {
    ShmPlan p = SmallPlan();
    (p.*o.array).assign(o.n, 1);
    const Status s = daemon::WritePlanBlock(block.get(), p);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(s.message().find(o.macro), std::string::npos) << s.message();
    EXPECT_EQ(block->seq, 0u) << "a refused plan leaves the block untouched";
  }
  ShmPlan zero = SmallPlan();
  zero.version = 0;
  EXPECT_FALSE(daemon::WritePlanBlock(block.get(), zero).ok());

  // Full capacities fit.
  ShmPlan full = SmallPlan();
  full.micro_batches.assign(FALCON_PLAN_MAX_MICRO_BATCHES, 7);
  full.placement.assign(FALCON_PLAN_MAX_PLACEMENT, 65535);
  full.exclude_nodes.assign(FALCON_PLAN_MAX_EXCLUDE, 3);
  full.warmup.assign(FALCON_PLAN_MAX_STAGES, 5);
  ASSERT_TRUE(daemon::WritePlanBlock(block.get(), full).ok());
  ASSERT_TRUE(daemon::ReadPlanBlock(*block, &copy).ok());
  EXPECT_EQ(copy.placement, full.placement);
  EXPECT_EQ(copy.warmup, full.warmup);

  ASSERT_TRUE(daemon::WritePlanBlock(block.get(), SmallPlan()).ok());
  EXPECT_EQ(shim::PlanVersion(*block), 3u);
  EXPECT_EQ(daemon::PlanBlockVersion(*block), 3u);
  ASSERT_EQ(shim::ReadPlanInfo(*block, &info), FALCON_OK);
  EXPECT_EQ(info.version, 3u);
  EXPECT_EQ(info.strategy, static_cast<uint32_t>(kFalconStrategyRestart));
  EXPECT_EQ(info.restart, 1u);
  EXPECT_EQ(info.issued_real_ns, 12345);
  EXPECT_EQ(info.micro_batch_count, 4u);
  EXPECT_EQ(info.placement_count, 5u) << "the previous, longer placement is not visible";
  EXPECT_EQ(info.exclude_count, 1u);
  const ShmPlan want = SmallPlan();
  const std::vector<int32_t>* wanted[] = {&want.micro_batches, &want.placement, &want.exclude_nodes, &want.warmup};
  for (int part = 0; part < 4; ++part) {
    std::vector<int32_t> buf(8, -1);
    version = 0;
    const int n = shim::ReadPlanPart(*block, kParts[part], buf.data(), 8, &version);
    ASSERT_EQ(n, static_cast<int>(wanted[part]->size()));
    EXPECT_EQ(version, 3u);
    EXPECT_EQ(std::vector<int32_t>(buf.begin(), buf.begin() + n), *wanted[part]);
    // Truncation: the full count comes back, only `capacity` entries are copied.
    std::vector<int32_t> small(3, -1);
    EXPECT_EQ(shim::ReadPlanPart(*block, kParts[part], small.data(), 1, nullptr), n);
    EXPECT_EQ(small[0], (*wanted[part])[0]);
    EXPECT_EQ(small[1], -1);
  }
  ASSERT_TRUE(daemon::ReadPlanBlock(*block, &copy).ok());
  EXPECT_EQ(copy.micro_batches, want.micro_batches);
  EXPECT_EQ(copy.exclude_nodes, want.exclude_nodes);
  EXPECT_EQ(copy.warmup, want.warmup);
  EXPECT_TRUE(copy.restart);
}

TEST(PlanBlockTest, AcksKeepTheHighestVersionsAndTheLatestAnswer) {
  auto block = FreshBlock();
  EXPECT_EQ(shim::AckPlan(*block, 0, 0), FALCON_ERR_INVALID);
  EXPECT_EQ(daemon::ReadPlanAcks(*block).count, 0u);
  EXPECT_EQ(shim::AckPlan(*block, 3, 0), FALCON_OK);
  EXPECT_EQ(shim::AckPlan(*block, 2, 0), FALCON_OK);  // a late answer to an older plan
  EXPECT_EQ(shim::AckPlan(*block, 4, -7), FALCON_OK);
  const daemon::PlanAcks a = daemon::ReadPlanAcks(*block);
  EXPECT_EQ(a.applied, 3u);
  EXPECT_EQ(a.rejected, 4u);
  EXPECT_EQ(a.last_version, 4u);
  EXPECT_EQ(a.last_status, -7);
  EXPECT_EQ(a.count, 3u);
}

TEST(PlanBlockTest, CostReportsKeepTheLatestFigurePerStrategyAndRefuseBadOnes) {
  auto block = FreshBlock();
  const daemon::PlanAcks none = daemon::ReadPlanAcks(*block);
  for (double c : none.cost_s) EXPECT_LT(c, 0) << "unreported until the framework says";
  struct Case {
    uint32_t strategy;
    double seconds;
    int rc;
  };
  const Case cases[] = {
      {kFalconStrategyNone, 1, FALCON_ERR_INVALID},      {kFalconStrategyIgnore, 1, FALCON_ERR_INVALID},
      {6, 1, FALCON_ERR_INVALID},                        {kFalconStrategyRebalance, -0.5, FALCON_ERR_INVALID},
      {kFalconStrategyTopology, std::nan(""), FALCON_ERR_INVALID},
      {kFalconStrategyRestart, 1e9, FALCON_ERR_INVALID},  // beyond 49 days
      {kFalconStrategyRestart, std::numeric_limits<double>::infinity(), FALCON_ERR_INVALID},
      {kFalconStrategyRebalance, 0.25, FALCON_OK},       {kFalconStrategyTopology, 0, FALCON_OK},
      {kFalconStrategyRestart, 600, FALCON_OK},          {kFalconStrategyRestart, 75.5, FALCON_OK},
      {kFalconStrategyPipeline, 0.125, FALCON_OK},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(shim::ReportCost(*block, c.strategy, c.seconds), c.rc) << c.strategy << " " << c.seconds;
  }
  const daemon::PlanAcks a = daemon::ReadPlanAcks(*block);
  EXPECT_DOUBLE_EQ(a.cost_s[0], 0.25);
  EXPECT_DOUBLE_EQ(a.cost_s[1], 1e-6) << "0 s is stored as 1 us: reported, and nearly free";
  EXPECT_DOUBLE_EQ(a.cost_s[2], 75.5) << "the latest report counts";
  EXPECT_DOUBLE_EQ(a.cost_s[3], 0.125) << "the pipeline plan's slot (API version 4)";
  EXPECT_EQ(a.count, 0u) << "a cost report is no ack";
}

TEST(PlanBlockTest, AWriterThatDiedMidWriteIsTakenOver) {
  auto block = FreshBlock();
  ASSERT_TRUE(daemon::WritePlanBlock(block.get(), SmallPlan()).ok());
  block->seq += 1;  // a writer stopped after making seq odd
  FalconPlanInfo info;
  EXPECT_EQ(shim::ReadPlanInfo(*block, &info), FALCON_ERR_BUSY) << "bounded retries, never a wait";
  EXPECT_EQ(info.version, 0u);
  ShmPlan next = SmallPlan();
  next.version = 4;
  ASSERT_TRUE(daemon::WritePlanBlock(block.get(), next).ok());
  EXPECT_EQ(block->seq % 2, 0u);
  ASSERT_EQ(shim::ReadPlanInfo(*block, &info), FALCON_OK);
  EXPECT_EQ(info.version, 4u);
}

// Checks one copy against the pattern; returns false for a mixed plan.
bool ConsistentCopy(const FalconPlanBlock& block, unsigned long long i, std::vector<int32_t>& buf, uint32_t* version,
                    int* rc) {
  const int which = static_cast<int>(i % 4) - 1;
  if (which < 0) {
    FalconPlanInfo info;
    *rc = shim::ReadPlanInfo(block, &info);
    *version = info.version;
    if (*rc != FALCON_OK) return true;
    return info.strategy == testing::PatternStrategy(*version) && info.restart == testing::PatternRestart(*version) &&
           info.issued_real_ns == testing::PatternIssuedNs(*version) &&
           info.micro_batch_count == PatternCount(*version, 0) && info.placement_count == PatternCount(*version, 1) &&
           info.exclude_count == PatternCount(*version, 2);
  }
  *rc = shim::ReadPlanPart(block, kParts[which], buf.data(), static_cast<int>(buf.size()), version);
  if (*rc < 0) return true;
  const auto part = static_cast<uint32_t>(which);
  if (static_cast<uint32_t>(*rc) != PatternCount(*version, part)) return false;
  for (int k = 0; k < *rc; ++k) {
    if (buf[static_cast<size_t>(k)] != PatternValue(*version, part, static_cast<uint32_t>(k))) return false;
  }
  return true;
}

TEST(PlanBlockTest, ConcurrentWriterNeverYieldsAMixedPlan) {
  auto block = FreshBlock();
  std::atomic<bool> stop{false};
  std::atomic<unsigned long long> reads{0}, busy{0}, mixed{0}, regressed{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&] {
      std::vector<int32_t> buf(FALCON_PLAN_MAX_PLACEMENT);
      uint32_t last = 0;
      for (unsigned long long i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        uint32_t version = 0;
        int rc = 0;
        const bool ok = ConsistentCopy(*block, i, buf, &version, &rc);
        if (rc == FALCON_ERR_BUSY) {
          busy.fetch_add(1, std::memory_order_relaxed);
        } else if (rc != FALCON_ERR_NO_PLAN) {
          reads.fetch_add(1, std::memory_order_relaxed);
          if (!ok) mixed.fetch_add(1, std::memory_order_relaxed);
          if (version < last) regressed.fetch_add(1, std::memory_order_relaxed);
          last = version;
        }
      }
    });
  }
  // The writer: as many plans as it can write in ~1 s (at least 200), sizes from 0 to full.
  timespec t0{}, now{};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  uint32_t v = 0;
  bool written = true;
  while (written) {
    written = daemon::WritePlanBlock(block.get(), PatternPlan(++v)).ok();
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (v >= 200 && (now.tv_sec - t0.tv_sec) * 1000000000LL + (now.tv_nsec - t0.tv_nsec) > 1000000000LL) break;
  }
  EXPECT_TRUE(written) << "plan " << v;
  // Let the readers see the last plan too.
  const unsigned long long seen = reads.load();
  for (int i = 0; i < 100000 && reads.load() < seen + 100; ++i) std::this_thread::yield();
  stop.store(true);
  for (std::thread& t : readers) t.join();
  std::printf("# %u plans written; %llu consistent copies, %llu busy\n", v, reads.load(), busy.load());
  EXPECT_EQ(mixed.load(), 0u) << "a copy mixed two plans";
  EXPECT_EQ(regressed.load(), 0u) << "a reader saw an older plan after a newer one";
  EXPECT_GT(reads.load(), 0u);
}

// ---- Across processes, through the real shim ------------------------------------------------

std::string Line(const std::string& out, const std::string& prefix) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  return "";
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

class ShimPlanApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    shm_ = dir_.path() + "/shm";
    ASSERT_EQ(::mkdir(shm_.c_str(), 0700), 0);
  }
  // Runs falcon-test-plan on a thread (its output is read when it exits).
  void Start(const std::vector<std::string>& args, std::vector<std::string> env = {}, bool with_shim = true) {
    std::vector<std::string> argv{testing::BinDir("tests") + "/falcon-test-plan"};
    argv.insert(argv.end(), args.begin(), args.end());
    env.push_back("FALCON_SHM_DIR=" + shm_);
    env.push_back("LD_LIBRARY_PATH=" + testing::NoopLibDir());
    if (with_shim) env.push_back("LD_PRELOAD=" + testing::PreloadValue());
    runner_ = std::thread([this, argv, env] { result_ = testing::Run(argv, env, 120); });
  }
  testing::ProcessResult Finish() {
    if (runner_.joinable()) runner_.join();
    return result_;
  }
  void TearDown() override {
    if (runner_.joinable()) runner_.join();
  }
  // The program's segment, opened as the agent opens it.
  daemon::SegmentReader OpenSegment() {
    auto listed = daemon::ListSegments(shm_, static_cast<uint32_t>(getuid()), false);
    EXPECT_TRUE(listed.ok() && listed.value().size() == 1);
    auto seg = daemon::SegmentReader::Open(listed.value().at(0).path, daemon::SegmentReader::Access::kReadWrite);
    EXPECT_TRUE(seg.ok()) << seg.status().ToString();
    return std::move(seg).value();
  }

  testing::TempDir dir_;
  std::string shm_;
  std::thread runner_;
  testing::ProcessResult result_;
};

TEST_F(ShimPlanApiTest, NoPlanUntilTheAgentWritesOneThenEveryGetterReturnsIt) {
  const std::string ready = dir_.path() + "/ready";
  Start({"api", "--want", "3", "--ack-status", "0", "--ready-file", ready, "--timeout", "60"});
  ASSERT_TRUE(testing::WaitUntil([&] { return Exists(ready); }, 60)) << "the program never got its segment";
  daemon::SegmentReader seg = OpenSegment();
  EXPECT_EQ(seg.plan_version(), 0u);
  ASSERT_TRUE(seg.WritePlan(SmallPlan()).ok());
  // The framework acks through falcon.h; the segment (still mapped here) shows it.
  EXPECT_TRUE(testing::WaitUntil([&] { return seg.plan_acks().applied == 3; }, 60));
  const testing::ProcessResult r = Finish();
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
  EXPECT_EQ(Line(r.out, "plan "), "plan version 3 strategy 4 restart 1 issued 12345 counts 4 5 1") << r.out;
  EXPECT_EQ(Line(r.out, "mb "), "mb version 3 count 4 [4,4,2,6]");
  EXPECT_EQ(Line(r.out, "placement "), "placement version 3 count 5 [0,0,1,1,2]");
  EXPECT_EQ(Line(r.out, "exclude "), "exclude version 3 count 1 [2]");
  EXPECT_EQ(Line(r.out, "warmup "), "warmup version 3 count 4 [3,3,1,0]");
  EXPECT_EQ(Line(r.out, "truncate mb"), "truncate mb count 4 copied [4,4] sentinel intact");
  EXPECT_EQ(Line(r.out, "truncate placement"), "truncate placement count 5 copied [0,0] sentinel intact");
  EXPECT_EQ(Line(r.out, "truncate exclude"), "truncate exclude count 1 copied [2] sentinel intact");
  EXPECT_EQ(Line(r.out, "truncate warmup"), "truncate warmup count 4 copied [3,3] sentinel intact");
  EXPECT_EQ(Line(r.out, "acked "), "acked 3 0 rc 0");
  EXPECT_EQ(Line(r.out, "cost "), "cost S4 rc 0");
  const daemon::PlanAcks acks = seg.plan_acks();
  EXPECT_DOUBLE_EQ(acks.cost_s[2], 42.5) << "falconReportCost reached the segment";
  EXPECT_LT(acks.cost_s[0], 0);
  EXPECT_EQ(acks.last_version, 3u);
  EXPECT_EQ(acks.last_status, 0);
  EXPECT_EQ(acks.rejected, 0u);
}

TEST_F(ShimPlanApiTest, PassThroughAndNoShimMeanNoPlan) {
  // FALCON_DISABLE: the shim passes calls through and has no segment: no plan, acks refused.
  Start({"api", "--want", "0"}, {"FALCON_DISABLE=1"});
  testing::ProcessResult r = Finish();
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
  // Without the shim the symbols are missing: the hook knows there is no Falcon.
  Start({"api", "--want", "0"}, {}, /*with_shim=*/false);
  r = Finish();
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
  EXPECT_NE(r.out.find("no falcon"), std::string::npos);
}

TEST_F(ShimPlanApiTest, ConcurrentAgentWritesNeverShowUpMixedThroughTheShim) {
  const std::string ready = dir_.path() + "/ready", stop = dir_.path() + "/stop";
  Start({"hammer", "--threads", "3", "--ready-file", ready, "--stop-file", stop, "--timeout", "60"});
  ASSERT_TRUE(testing::WaitUntil([&] { return Exists(ready); }, 60));
  daemon::SegmentReader seg = OpenSegment();
  timespec t0{}, now{};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  uint32_t v = 0;
  for (;;) {
    ASSERT_TRUE(seg.WritePlan(PatternPlan(++v)).ok());
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (v >= 200 && (now.tv_sec - t0.tv_sec) * 1000000000LL + (now.tv_nsec - t0.tv_nsec) > 1500000000LL) break;
  }
  { std::ofstream(stop).put('\n'); }
  const testing::ProcessResult r = Finish();
  std::printf("# %u plans written; %s\n", v, Line(r.out, "hammer ").c_str());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  unsigned long long reads = 0, busy = 0, no_plan = 0, mixed = 1, regressed = 1;
  unsigned max_version = 0;
  ASSERT_EQ(std::sscanf(Line(r.out, "hammer ").c_str(),
                        "hammer reads %llu busy %llu no_plan %llu mixed %llu regressed %llu max_version %u", &reads,
                        &busy, &no_plan, &mixed, &regressed, &max_version),
            6)
      << r.out;
  EXPECT_EQ(mixed, 0u) << r.out;
  EXPECT_EQ(regressed, 0u);
  EXPECT_GT(reads, 0u);
  EXPECT_GT(max_version, 0u);
  EXPECT_LE(max_version, v);
}

}  // namespace
}  // namespace falcon
