// End-to-end test of the pure pipeline (signatures -> tracked period -> iteration series ->
// detector) on REAL call records: the first 600 records of rank 0 of a 4-rank emulator job
// (bench/emu falcon-emu-job, 5 ms compute, under the LD_PRELOAD shim), dumped with
// `falcon-ctl trace --file SEGMENT --json` and checked in as testdata/emu_job_rank0.jsonl.
// The test reads no file (analyzer tests stay pure): testdata/emu_job_rank0.inc holds the same
// records as C++ rows, made from the .jsonl with
//   python3 -c 'import json,sys; ops={"AllReduce":"kAllReduce","AllGather":"kAllGather",
//     "ReduceScatter":"kReduceScatter","Send":"kSend","Recv":"kRecv","Broadcast":"kBroadcast"}
//     [print("{OpKind::%s, 0x%xULL, %d, %d, %d}," % (ops.get(r["op"], "kOther"),
//      int(r["comm"] or "0", 16), r["bytes"], r["peer"], r["t_start_ns"]))
//      for r in map(json.loads, sys.stdin)]' < emu_job_rank0.jsonl
// (plus a comment line). `falcon-ctl analyze-trace testdata/emu_job_rank0.jsonl` runs the same
// pipeline through the daemon's reader.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "analyzer/detector.h"
#include "analyzer/iteration_series.h"
#include "analyzer/period_tracker.h"
#include "analyzer/signature.h"

namespace falcon::analyzer {
namespace {

const CallRecord kEmuJobRank0[] = {
#include "analyzer/testdata/emu_job_rank0.inc"
};

TEST(PipelineTest, RealEmulatorDumpGivesPeriodAndIterations) {
  // Per iteration the job issues 3 TP all-reduces, a TP all-gather and reduce-scatter, a grouped
  // send/recv on the world, a DP all-reduce and a broadcast: 9 signatures (+ 2 group brackets).
  const std::vector<CallRecord> calls(std::begin(kEmuJobRank0), std::end(kEmuJobRank0));
  SignatureTable table;
  const SignatureSequence seq = MakeSignatureSequence(calls, table);
  PeriodTracker tracker;
  std::size_t locks = 0;
  for (std::size_t i = 0; i < seq.symbols.size(); ++i) {
    locks += tracker.Push(seq.symbols[i], i) == TrackerEvent::kLocked ? 1U : 0U;
  }
  ASSERT_EQ(locks, 1U);
  ASSERT_EQ(tracker.period(), 9U);
  EXPECT_GE(tracker.acf(), 0.95);

  const auto from = static_cast<std::ptrdiff_t>(tracker.locked_from());
  const std::vector<std::uint32_t> symbols(seq.symbols.begin() + from, seq.symbols.end());
  const std::vector<std::int64_t> times(seq.t_ns.begin() + from, seq.t_ns.end());
  const auto samples = ExtractIterations(symbols, times, tracker.period());
  // Independent truth: one broadcast per iteration, so broadcast-to-broadcast gaps.
  std::vector<double> truth;
  std::int64_t last = -1;
  for (const CallRecord& c : calls) {
    if (c.op != OpKind::kBroadcast) continue;
    if (last >= 0) truth.push_back(static_cast<double>(c.t_ns - last) * 1e-9);
    last = c.t_ns;
  }
  ASSERT_GE(truth.size(), 50U);
  EXPECT_GE(samples.size() + 2, truth.size());  // at most the partial first/last iterations lost
  EXPECT_LE(samples.size(), truth.size());
  std::vector<double> got;
  for (const auto& s : samples) got.push_back(s.seconds);
  std::sort(got.begin(), got.end());
  std::sort(truth.begin(), truth.end());
  const double got_median = got[got.size() / 2];
  const double true_median = truth[truth.size() / 2];
  EXPECT_NEAR(got_median, true_median, 0.05 * true_median);
  EXPECT_GT(got_median, 0.005);  // at least the modelled 5 ms of compute per iteration

  FailSlowDetector detector;  // a healthy job: no alarm
  for (const auto& s : samples) EXPECT_FALSE(detector.Push(s.seconds).alarm.has_value());
}

}  // namespace
}  // namespace falcon::analyzer
