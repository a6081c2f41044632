// The agent's pure parts, without processes: the config table (sources and precedence, bounds,
// the sample config in sync with the table), the online iteration series (samples equal the
// true iteration times, never overlap, whatever the poll boundaries), the outbox (bounded,
// oldest dropped, confirmation by sequence), command outcomes that need no rank (expired,
// rejected), the stall watch (its bound, what counts as outstanding, what never is a stall),
// the call pattern behind cut_info (calls from two threads, as PyTorch's training and
// autograd threads issue them), and the Prometheus rendering.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "daemon/agent/agent_config.h"
#include "daemon/agent/call_pattern.h"
#include "daemon/agent/comm_profiler.h"
#include "daemon/agent/command_executor.h"
#include "daemon/agent/metrics.h"
#include "daemon/agent/online_series.h"
#include "daemon/agent/outbox.h"
#include "daemon/agent/plan_delivery.h"
#include "daemon/agent/rank_analysis.h"
#include "daemon/agent/signature_log.h"
#include "daemon/agent/stall_watch.h"
#include "daemon/protocol/validate.h"
#include "falcon/falcon.h"

namespace falcon::agent {
namespace {

TEST(AgentConfigTest, SourcesApplyInOrderDefaultsFileEnvironmentFlags) {
  AgentConfig c;
  ASSERT_TRUE(ApplyConfigText(c, "# comment\npoll_ms = 200\njob = a\nredis_port=7000 # trailing\n",
                              "f").ok());
  EXPECT_EQ(c.poll_ms, 200);
  EXPECT_EQ(c.job, "a");
  EXPECT_EQ(c.redis_port, 7000);
  std::map<std::string, std::string> env{{"FALCON_AGENT_JOB", "b"}, {"FALCON_AGENT_MIN_CHANGE", "0.2"}};
  ASSERT_TRUE(ApplyEnvironment(c, [&](const char* n) {
                auto it = env.find(n);
                return it == env.end() ? nullptr : it->second.c_str();
              }).ok());
  EXPECT_EQ(c.job, "b");
  EXPECT_DOUBLE_EQ(c.min_change, 0.2);
  ASSERT_TRUE(ApplyFlags(c, {{"job", "c"}, {"reap_orphans", "true"}}).ok());
  EXPECT_EQ(c.job, "c");
  EXPECT_TRUE(c.reap_orphans);
  EXPECT_EQ(c.poll_ms, 200) << "untouched by later sources";
  EXPECT_EQ(EnvName("poll_ms"), "FALCON_AGENT_POLL_MS");
  EXPECT_EQ(FlagName("poll_ms"), "--poll-ms");
}

TEST(AgentConfigTest, BadValuesAreErrorsThatNameTheOption) {
  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {{"poll_ms = 5", "poll_ms"},          {"poll_ms = 1.5", "integer"},
               {"poll_ms = ten", "not a number"},   {"nope = 1", "unknown option"},
               {"log_level = loud", "one of"},      {"reap_orphans = maybe", "boolean"},
               {"job =", "length"},                 {"just words", "name = value"},
               {"min_change = nan", "not a number"}};
  for (const Case& k : cases) {
    AgentConfig c;
    const Status s = ApplyConfigText(c, k.text, "test.conf");
    EXPECT_FALSE(s.ok()) << k.text;
    EXPECT_NE(s.message().find(k.expect), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("test.conf:1"), std::string::npos) << s.message();
  }
  AgentConfig c;
  c.redis_backoff_min_ms = 9000;
  c.redis_backoff_max_ms = 100;
  EXPECT_FALSE(CheckConfig(c).ok());
  c = AgentConfig();
  c.key_ttl_s = 1;
  c.heartbeat_ms = 5000;
  EXPECT_FALSE(CheckConfig(c).ok());
  EXPECT_TRUE(CheckConfig(AgentConfig()).ok());
}

// A value holding '#' (a password, a path) is written quoted and read back whole; a control
// character, which would break the file --print-config writes, is refused from every source.
TEST(AgentConfigTest, QuotedValuesKeepHashesAndControlCharactersAreRefused) {
  AgentConfig c;
  ASSERT_TRUE(ApplyConfigText(c, "redis_password = \"pa#ss\\\"w\" # the password\njob = \"a#b\"\n", "f").ok());
  EXPECT_EQ(c.redis_password, "pa#ss\"w");
  EXPECT_EQ(c.job, "a#b");
  const std::string rendered = RenderConfig(c, ConfigStyle::kValues);
  EXPECT_NE(rendered.find("job = \"a#b\"\n"), std::string::npos) << rendered;
  AgentConfig again;
  ASSERT_TRUE(ApplyConfigText(again, rendered, "rendered").ok());
  EXPECT_EQ(again.job, "a#b");
  EXPECT_EQ(ApplyConfigText(c, "job = \"open", "f").message(), "f:1: job: no closing quote");
  EXPECT_FALSE(ApplyConfigText(c, "job = \"a\" b", "f").ok());
  const char* bad = "a\nredis_port = 1";
  const Status s = ApplyEnvironment(c, [&](const char* n) { return std::string(n) == "FALCON_AGENT_JOB" ? bad : nullptr; });
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("control character 0x0a"), std::string::npos) << s.message();
}

TEST(AgentConfigTest, SampleConfigDocumentsEveryOptionAtItsDefault) {
  std::ifstream f(std::string(FALCON_TEST_SOURCE_DIR) + "/config/falcon-agent.conf");
  ASSERT_TRUE(f.good());
  std::stringstream buf;
  buf << f.rdbuf();
  const std::string text = buf.str();
  AgentConfig parsed;
  ASSERT_TRUE(ApplyConfigText(parsed, text, "falcon-agent.conf").ok());
  for (const ConfigEntry& e : ConfigTable()) {
    const std::string line = (e.secret ? "\n# " : "\n") + std::string(e.name) + " = ";
    EXPECT_NE(text.find(line), std::string::npos) << e.name;
    EXPECT_NE(text.find(std::string(e.meaning)), std::string::npos) << e.name;
    EXPECT_EQ(ValueText(parsed, e), ValueText(AgentConfig(), e)) << e.name;
  }
  EXPECT_TRUE(text.ends_with(RenderConfig(AgentConfig(), ConfigStyle::kDocumented)))
      << "regenerate config/falcon-agent.conf (see docs/agent.md)";
}

TEST(AgentConfigTest, PasswordIsNeverRendered) {
  AgentConfig c;
  c.redis_password = "hunter2";
  for (ConfigStyle style : {ConfigStyle::kValues, ConfigStyle::kDocumented}) {
    const std::string r = RenderConfig(c, style);
    EXPECT_EQ(r.find("hunter2"), std::string::npos);
    EXPECT_NE(r.find("# redis_password = <set>"), std::string::npos);
  }
}

// A periodic call stream: `period` calls per iteration, iteration i lasting durations[i].
struct Stream {
  std::vector<std::uint32_t> symbols;
  std::vector<std::int64_t> t;
};
Stream MakeStream(std::size_t period, const std::vector<double>& durations) {
  Stream s;
  std::int64_t now = 1000000000;
  for (double d : durations) {
    const auto iter_ns = static_cast<std::int64_t>(d * 1e9);
    const std::int64_t gap = iter_ns / (4 * static_cast<std::int64_t>(period));
    // A long gap before the first call (compute), then the calls close together.
    std::int64_t t = now + iter_ns - gap * static_cast<std::int64_t>(period);
    for (std::size_t j = 0; j < period; ++j) {
      s.symbols.push_back(static_cast<std::uint32_t>(j));
      s.t.push_back(t);
      t += gap;
    }
    now += iter_ns;
  }
  return s;
}

// Where a sample ends (its start plus its duration), and that each one starts at or after the
// end of the one before.
std::int64_t SampleEnd(const SeriesSample& x) { return x.start_ns + std::llround(x.seconds * 1e9); }
void ExpectNoOverlap(const std::vector<SeriesSample>& out) {
  for (std::size_t k = 1; k < out.size(); ++k) {
    EXPECT_GE(out[k].start_ns + 2, SampleEnd(out[k - 1])) << "samples never overlap";
  }
}

// 400 iterations of 9 calls, 20 ms +-5 %, the last 150 of them 1.5x slower.
Stream SlowingStream(std::mt19937& rng) {
  std::uniform_real_distribution<double> jitter(0.95, 1.05);
  std::vector<double> durations;
  for (int i = 0; i < 400; ++i) durations.push_back(0.02 * jitter(rng) * (i >= 250 ? 1.5 : 1.0));
  return MakeStream(9, durations);
}

TEST(OnlineSeriesTest, SamplesMatchTheIterationsAcrossArbitraryPollBoundaries) {
  std::mt19937 rng(7);
  const Stream s = SlowingStream(rng);
  OnlineSeriesOptions o;
  o.keep_cycles = 8;
  o.extract_every_ns = 0;  // at every new period: the buffer bound below is for that
  OnlineIterationSeries series(o);
  series.Start(9);
  std::vector<SeriesSample> out;
  std::uniform_int_distribution<std::size_t> chunk(1, 60);
  for (std::size_t i = 0; i < s.symbols.size();) {
    const std::size_t end = std::min(s.symbols.size(), i + chunk(rng));
    for (; i < end; ++i) series.Push(s.symbols[i], s.t[i]);
    series.Drain(&out);
    EXPECT_LE(series.buffered(), o.keep_cycles * 9 + 64 + 60 + 18) << "bounded buffer";
  }
  ASSERT_GE(out.size(), 390u);
  ExpectNoOverlap(out);
  // Anchor-to-anchor times are the iteration durations (shifted by the anchor's phase).
  std::size_t slow = 0;
  for (const SeriesSample& x : out) slow += x.seconds > 0.025 ? 1 : 0;
  EXPECT_NEAR(static_cast<double>(slow), 150.0, 3.0);
}

// Once the boundary search has seen its cycles, the anchor is kept and each extraction walks on
// from the last sample's end: the samples stay the batch extraction's over the whole stream (calls
// inserted now and then included), and the search is not run at every extraction.
TEST(OnlineSeriesTest, AKeptAnchorGivesTheBatchSamplesWithoutSearchingAgain) {
  std::mt19937 rng(13);
  Stream s = SlowingStream(rng);
  Stream with_extra;  // an extra call (a logging barrier) in every 13th iteration
  for (std::size_t i = 0; i < s.symbols.size(); ++i) {
    with_extra.symbols.push_back(s.symbols[i]);
    with_extra.t.push_back(s.t[i]);
    if (i % (13 * 9) == 4) {
      with_extra.symbols.push_back(77);
      with_extra.t.push_back(s.t[i] + 1000);
    }
  }
  const auto batch = analyzer::ExtractIterations(with_extra.symbols, with_extra.t, 9);
  ASSERT_GE(batch.size(), 390u);
  OnlineSeriesOptions o;
  o.keep_cycles = 8;
  o.extract_every_ns = 0;
  OnlineIterationSeries series(o);
  series.Start(9);
  std::vector<SeriesSample> out;
  std::size_t drains = 0, searches_at_100 = 0;
  for (std::size_t i = 0; i < with_extra.symbols.size(); ++i) {
    series.Push(with_extra.symbols[i], with_extra.t[i]);
    if (i % 11 == 10) {
      series.Drain(&out);
      if (++drains == 100) searches_at_100 = series.anchor_searches();
    }
  }
  ExpectNoOverlap(out);
  EXPECT_GE(out.size() + 3, batch.size());
  std::size_t same = 0;
  for (const SeriesSample& x : out) {
    same += std::any_of(batch.begin(), batch.end(), [&](const analyzer::IterationSample& y) {
      return x.start_ns == y.start_ns && x.seconds == y.seconds;
    }) ? 1 : 0;
  }
  EXPECT_GE(same + 2, out.size()) << "the online samples are the batch ones";
  EXPECT_GT(drains, 300u);
  // About one search per extraction until 17 periods are buffered (~14 here), none after that.
  EXPECT_GE(searches_at_100, 1u);
  EXPECT_LE(searches_at_100, 25u);
  EXPECT_EQ(series.anchor_searches(), searches_at_100) << "the kept anchor is searched for again";
}

// Extraction at most once per second of record time: the same iterations come out, up to a
// second later, and the buffer holds that second's calls besides the kept cycles.
TEST(OnlineSeriesTest, ExtractionOncePerIntervalKeepsTheSamplesAndDelaysThemAtMostThatLong) {
  std::mt19937 rng(11);
  const Stream s = SlowingStream(rng);
  struct Run {
    std::vector<SeriesSample> out;
    std::size_t max_buffered = 0;
    std::int64_t max_lag_ns = 0;  // newest call pushed - end of the newest sample out, after a Drain
  };
  auto run = [&](std::int64_t every_ns) {
    OnlineSeriesOptions o;
    o.keep_cycles = 8;
    o.extract_every_ns = every_ns;
    OnlineIterationSeries series(o);
    series.Start(9);
    Run r;
    std::mt19937 chunks(5);
    std::uniform_int_distribution<std::size_t> chunk(1, 60);
    for (std::size_t i = 0; i < s.symbols.size();) {
      const std::size_t end = std::min(s.symbols.size(), i + chunk(chunks));
      for (; i < end; ++i) series.Push(s.symbols[i], s.t[i]);
      series.Drain(&r.out);
      r.max_buffered = std::max(r.max_buffered, series.buffered());
      if (!r.out.empty()) {
        r.max_lag_ns = std::max(r.max_lag_ns, s.t[i - 1] - SampleEnd(r.out.back()));
      }
    }
    return r;
  };
  const Run every = run(0);
  const Run second = run(1'000'000'000);
  ASSERT_GE(every.out.size(), 390u);
  // Up to one second (about 50 iterations of 20-30 ms) not yet extracted when the stream ends.
  EXPECT_GE(second.out.size() + 55, every.out.size());
  EXPECT_LE(second.out.size(), every.out.size() + 1);
  ExpectNoOverlap(second.out);
  // The same durations: every sample of the interval run is one of the per-period run's.
  std::size_t same = 0;
  for (const SeriesSample& x : second.out) {
    for (const SeriesSample& y : every.out) {
      if (x.start_ns == y.start_ns && std::abs(x.seconds - y.seconds) < 1e-9) {
        ++same;
        break;
      }
    }
  }
  EXPECT_GE(same + 2, second.out.size());
  EXPECT_LT(every.max_lag_ns, 200'000'000);
  EXPECT_LT(second.max_lag_ns, 1'200'000'000) << "a sample is late by at most the interval and a period";
  EXPECT_GT(second.max_lag_ns, 500'000'000) << "the interval is in force";
  EXPECT_LE(second.max_buffered, 8 * 9 + 64 + 60 + 18 + 55 * 9);
}

// Intervals sit on multiples of extract_every_ns of the shared clock: two ranks in step extract
// in the same polls, whenever each of them started, so the agent flushes their samples together.
TEST(OnlineSeriesTest, RanksInStepExtractInTheSameIntervals) {
  const Stream s = MakeStream(9, std::vector<double>(290, 0.02));  // 1.0 s to 6.8 s
  OnlineIterationSeries a, b;  // default: once a second
  a.Start(9);
  b.Start(9);
  std::vector<SeriesSample> out_a, out_b;
  std::set<std::size_t> polls_a, polls_b;  // the polls in which each one emitted
  constexpr std::size_t kLaterLock = 1357;  // b's calls start 3 s after a's, mid-interval
  for (std::size_t i = 0; i < s.symbols.size(); ++i) {
    a.Push(s.symbols[i], s.t[i]);
    if (i >= kLaterLock) b.Push(s.symbols[i], s.t[i]);
    if (i % 20 != 19) continue;  // one agent poll every 20 calls
    const std::size_t had_a = out_a.size(), had_b = out_b.size();
    a.Drain(&out_a);
    b.Drain(&out_b);
    if (out_a.size() > had_a) polls_a.insert(i);
    if (out_b.size() > had_b) polls_b.insert(i);
  }
  ASSERT_GE(polls_b.size(), 3u);
  // After b's first extraction (which comes whenever it starts), both extract in the same polls.
  const std::size_t first_b = *polls_b.begin();
  polls_b.erase(first_b);
  std::erase_if(polls_a, [&](std::size_t p) { return p <= first_b; });
  EXPECT_EQ(polls_a, polls_b);
}

TEST(OnlineSeriesTest, StopForgetsAndNewLockDoesNotRepeatTime) {
  const Stream s = MakeStream(5, std::vector<double>(60, 0.01));
  OnlineIterationSeries series;
  series.Start(5);
  std::vector<SeriesSample> out;
  for (std::size_t i = 0; i < 150; ++i) series.Push(s.symbols[i], s.t[i]);
  series.Drain(&out);
  const std::size_t first = out.size();
  ASSERT_GT(first, 20u);
  series.Stop();
  EXPECT_EQ(series.buffered(), 0u);
  series.Start(5);
  for (std::size_t i = 0; i < s.symbols.size(); ++i) series.Push(s.symbols[i], s.t[i]);  // replay
  series.Drain(&out);
  ASSERT_GT(out.size(), first + 20);
  EXPECT_LE(out.size(), 59u) << "60 iterations give at most 59 anchor-to-anchor samples";
  const std::int64_t first_end = SampleEnd(out[first - 1]);
  for (std::size_t k = first; k < out.size(); ++k) {
    EXPECT_GE(out[k].start_ns + 2, first_end) << "only time after the last sample is new";
  }
}

// Nine calls per iteration (three communicators, several ops and sizes), 200 iterations of
// 20 ms then 100 of 40 ms, fed call by call with flushes at arbitrary points, as the agent does.
TEST(RankAnalysisTest, LocksThePeriodEmitsIterationsAndRaisesOneSlowAlarm) {
  RankAnalysisOptions options;
  options.series.extract_every_ns = 0;  // at every period: the stream's last second counts too
  RankAnalysis analysis(options);
  RankUpdate all;
  std::mt19937 rng(3);
  std::normal_distribution<double> noise(1.0, 0.01);
  std::int64_t t = 1000000000;
  const analyzer::OpKind ops[] = {analyzer::OpKind::kAllReduce, analyzer::OpKind::kAllReduce,
                                  analyzer::OpKind::kAllReduce, analyzer::OpKind::kAllGather,
                                  analyzer::OpKind::kReduceScatter, analyzer::OpKind::kSend,
                                  analyzer::OpKind::kRecv, analyzer::OpKind::kAllReduce,
                                  analyzer::OpKind::kBroadcast};
  for (int it = 0; it < 300; ++it) {
    const double iter_s = (it < 200 ? 0.020 : 0.040) * noise(rng);
    const auto compute = static_cast<std::int64_t>(iter_s * 0.8e9);
    t += compute;
    for (int j = 0; j < 9; ++j) {
      analyzer::CallRecord call;
      call.op = ops[j];
      call.comm = j < 5 ? 11 : (j < 7 ? 22 : 33);
      call.bytes = 1u << (10 + j % 3);
      call.peer = j == 5 || j == 6 ? 1 : -1;
      call.t_ns = t;
      t += static_cast<std::int64_t>(iter_s * 0.2e9) / 9;
      analysis.Push(call);
      analyzer::CallRecord group;  // management calls form no signature
      group.op = analyzer::OpKind::kOther;
      analysis.Push(group);
    }
    if (it % 7 == 0) analysis.Flush(&all);
  }
  analysis.Flush(&all);
  ASSERT_EQ(all.locks.size(), 1u);
  EXPECT_EQ(all.locks[0], 9u);
  EXPECT_EQ(analysis.period(), 9u);
  ASSERT_GE(all.samples.size(), 280u);
  std::size_t slow_samples = 0, first_slow = all.samples.size();
  for (std::size_t i = 0; i < all.samples.size(); ++i) {
    EXPECT_EQ(all.samples[i].index, i) << "dense indices";
    EXPECT_EQ(all.samples[i].period, 9u);
    EXPECT_GT(all.samples[i].seconds, 0.018);
    EXPECT_LT(all.samples[i].seconds, 0.043);
    if (all.samples[i].seconds > 0.03) {
      ++slow_samples;
      first_slow = std::min(first_slow, i);
    }
  }
  EXPECT_NEAR(static_cast<double>(slow_samples), 100.0, 2.0);
  ASSERT_EQ(all.alarms.size(), 1u);
  const RankAlarm& a = all.alarms[0];
  EXPECT_EQ(a.alarm.type, analyzer::AlarmType::kSlow);
  EXPECT_NEAR(static_cast<double>(a.alarm.onset), static_cast<double>(first_slow), 2.0);
  EXPECT_NEAR(a.alarm.ratio, 2.0, 0.15);
  ASSERT_TRUE(a.onset_ns.has_value());
  EXPECT_NEAR(a.baseline_seconds, 0.020, 0.002);
  EXPECT_TRUE(analysis.slow());
}

// A phase the framework annotated (an evaluation of 40 slow iterations) and a validation pause:
// their iterations are left out of detection and of the samples, so nothing is alarmed; the same
// slow stretch without the annotation is a fail-slow.
TEST(RankAnalysisTest, IterationsInsideAPhaseOrAPauseAreLeftOut) {
  for (const bool annotated : {true, false}) {
    SCOPED_TRACE(annotated ? "annotated" : "not annotated");
    RankAnalysis analysis;
    RankUpdate all;
    std::mt19937 rng(5);
    std::normal_distribution<double> noise(1.0, 0.01);
    std::int64_t t = 1000000000;
    for (int it = 0; it < 300; ++it) {
      const bool eval = it >= 150 && it < 190;  // 40 iterations at twice the time
      if (annotated && it == 150) analysis.Quiet(t, QuietSource::kPhase, true);
      if (annotated && it == 190) analysis.Quiet(t, QuietSource::kPhase, false);
      if (annotated && it == 100) analysis.Quiet(t + 1000, QuietSource::kPause, true);  // inside iteration 100
      const double iter_s = (eval ? 0.040 : 0.020) * noise(rng);
      t += static_cast<std::int64_t>(iter_s * 0.8e9);
      if (annotated && it == 100) analysis.Quiet(t, QuietSource::kPause, false);
      for (int j = 0; j < 4; ++j) {
        analyzer::CallRecord call;
        call.op = j < 3 ? analyzer::OpKind::kAllReduce : analyzer::OpKind::kAllGather;
        call.comm = 11 + j;
        call.bytes = 1024;
        call.t_ns = t;
        t += static_cast<std::int64_t>(iter_s * 0.2e9) / 4;
        analysis.Push(call);
      }
      if (it % 5 == 0) analysis.Flush(&all);
    }
    analysis.Flush(&all);
    if (annotated) {
      EXPECT_TRUE(all.alarms.empty()) << all.alarms.size() << " alarms";
      EXPECT_GE(all.excluded, 40u + 1u) << "the phase's iterations and the paused one";
      EXPECT_LE(all.excluded, 40u + 4u) << "and the ones they touch, no more";
      EXPECT_EQ(analysis.excluded(), all.excluded);
      for (const RankSample& s : all.samples) EXPECT_LT(s.seconds, 0.03) << "no slow iteration reported";
    } else {
      EXPECT_EQ(all.excluded, 0u);
      ASSERT_FALSE(all.alarms.empty());
      EXPECT_EQ(all.alarms[0].alarm.type, analyzer::AlarmType::kSlow);
    }
  }
}

TEST(CommProfilerTest, CountsPerSignatureAndTimesOnlyCallsWithAnEndTime) {
  CommProfiler p;
  FalconCommEntry comm{};
  comm.comm_id = 0xab;
  comm.rank = 1;
  comm.nranks = 4;
  for (int i = 0; i < 10; ++i) {
    FalconRecord r{};
    r.op = kFalconOpAllReduce;
    r.dtype = 7;  // ncclFloat32
    r.count = 256;
    r.peer = -1;
    r.t_start_ns = 1000;
    r.t_end_ns = 1000 + 1000 * (i + 1);  // 1..10 us
    r.flags = i < 5 ? kFalconFlagHostEnd : 0;
    p.Add(r, comm);
  }
  FalconRecord mgmt{};
  mgmt.op = kFalconOpCommInitRank;
  p.Add(mgmt, comm);
  const std::vector<CommStats> w = p.TakeWindow();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].id, 0xabu);
  EXPECT_EQ(w[0].nranks, 4);
  ASSERT_EQ(w[0].sigs.size(), 1u);
  const SignatureStats& s = w[0].sigs[0];
  EXPECT_EQ(s.op, "AllReduce");
  EXPECT_EQ(s.bytes, 1024u);
  EXPECT_EQ(s.count, 10u);
  EXPECT_EQ(s.timed, 5u);
  EXPECT_DOUBLE_EQ(s.mean_us, 3.0);
  EXPECT_DOUBLE_EQ(s.median_us, 3.0);
  EXPECT_TRUE(p.TakeWindow().empty()) << "a fresh window";
}

// On a GPU a call returns once its work is enqueued: the profile must hold the device times the
// shim measured with CUDA events, joined to their calls by (lane, index) — grouped send/recv
// included, which share their group's time — not the microseconds of host enqueue.
TEST(CommProfilerTest, DeviceTimesReplaceEnqueueTimesAndGroupsShareTheirGroupsTime) {
  CommProfiler p;
  FalconCommEntry comm{};
  comm.comm_id = 0xcd;
  comm.rank = 0;
  comm.nranks = 2;
  uint64_t index = 0;
  auto call = [&](uint8_t op, uint8_t flags, int32_t peer) {
    FalconRecord r{};
    r.op = op;
    r.dtype = 7;
    r.count = 1024;
    r.peer = peer;
    r.lane = 1;
    r.version = 2 * index++ + 2;
    r.t_start_ns = 1'000'000;
    r.t_end_ns = 1'002'000;  // 2 us of enqueue
    r.flags = static_cast<uint8_t>(flags | kFalconFlagHostEnd);
    r.group_depth = (flags & kFalconFlagInGroup) != 0 ? 1 : 0;
    return r;
  };
  auto timing = [](uint64_t ref, int64_t us, uint8_t result) {
    FalconRecord t{};
    t.op = kFalconOpGpuTiming;
    t.comm_seq = ref;
    t.peer = 1;
    t.result = result;
    t.t_start_ns = 5'000'000;
    t.t_end_ns = 5'000'000 + us * 1000;
    return t;
  };
  // Three all-reduces: device times 400, 500 us; the third's events failed.
  std::vector<uint64_t> refs;
  for (int i = 0; i < 3; ++i) {
    FalconRecord r = call(kFalconOpAllReduce, kFalconFlagGpuPending, -1);
    refs.push_back(daemon::RecordIndex(r));
    p.Add(r, comm);
  }
  // A group of a send and a receive, timed as one by its group end: 900 us.
  p.Add(call(kFalconOpSend, kFalconFlagInGroup, 1), comm);
  p.Add(call(kFalconOpRecv, kFalconFlagInGroup, 1), comm);
  FalconRecord end = call(kFalconOpGroupEnd, kFalconFlagGpuPending | kFalconFlagInGroup, -1);
  p.Observe(end);
  p.Observe(timing(refs[1], 500, 0));  // out of order, as the service thread may publish them
  p.Observe(timing(refs[0], 400, 0));
  p.Observe(timing(refs[2], 1, 1));
  p.Observe(timing(daemon::RecordIndex(end), 900, 0));
  p.Observe(timing(12345, 7, 0));  // refers to nothing we hold: ignored
  const std::vector<CommStats> w = p.TakeWindow();
  ASSERT_EQ(w.size(), 1u);
  ASSERT_EQ(w[0].sigs.size(), 3u);
  for (const SignatureStats& s : w[0].sigs) {
    SCOPED_TRACE(s.op);
    if (s.op == "AllReduce") {
      EXPECT_EQ(s.count, 3u);
      EXPECT_EQ(s.timed, 2u) << "the failed timing leaves its call untimed, never with its enqueue time";
      EXPECT_EQ(s.device, 2u);
      EXPECT_DOUBLE_EQ(s.mean_us, 450.0);
    } else {
      EXPECT_EQ(s.count, 1u);
      EXPECT_EQ(s.timed, 1u);
      EXPECT_EQ(s.device, 1u);
      EXPECT_DOUBLE_EQ(s.median_us, 900.0) << "the group's time";
    }
  }
  // A device time that comes after its window was taken counts in the next window.
  FalconRecord late = call(kFalconOpAllReduce, kFalconFlagGpuPending, -1);
  p.Add(late, comm);
  ASSERT_EQ(p.TakeWindow().size(), 1u);
  p.Observe(timing(daemon::RecordIndex(late), 300, 0));
  const std::vector<CommStats> next = p.TakeWindow();
  ASSERT_EQ(next.size(), 1u);
  ASSERT_EQ(next[0].sigs.size(), 1u);
  EXPECT_EQ(next[0].sigs[0].timed, 1u);
  EXPECT_DOUBLE_EQ(next[0].sigs[0].mean_us, 300.0);
  EXPECT_EQ(next[0].rank, 0);
  EXPECT_EQ(next[0].nranks, 2);
}

// A PyTorch rank issues its forward collectives from the training thread and its backward ones
// from the autograd thread: the pattern holds both lanes' calls, and groups of the two lanes
// that happen to have the same ordinal stay apart.
TEST(CallPatternTest, CallsOfTwoThreadsMakeOnePeriod) {
  CallPatternLog log;
  constexpr std::uint64_t kTp = 0x11, kPp = 0x22;
  std::uint64_t tp_seq = 0, pp_seq = 0;
  std::int64_t t = 1000;
  std::uint32_t next_group[2] = {0, 0};
  auto call = [&](int lane, std::uint64_t comm, bool grouped) {
    FalconRecord r{};
    r.op = comm == kTp ? kFalconOpAllReduce : kFalconOpSend;
    r.lane = static_cast<std::uint8_t>(lane);
    r.comm_seq = comm == kTp ? tp_seq++ : pp_seq++;
    r.t_start_ns = t += 10;
    r.flags = grouped ? kFalconFlagInGroup : 0;
    log.Push(r, comm);
  };
  auto group = [&](int lane, int calls) {
    FalconRecord g{};
    g.op = kFalconOpGroupStart;
    g.lane = static_cast<std::uint8_t>(lane);
    g.t_start_ns = t += 10;
    log.Push(g, 0);
    ++next_group[lane];
    for (int i = 0; i < calls; ++i) call(lane, kPp, true);
  };
  constexpr int kPeriods = 4;
  for (int it = 0; it < kPeriods; ++it) {
    call(0, kTp, false);  // forward: training thread
    group(0, 2);          // send activations, receive the next micro-batch's
    call(1, kTp, false);  // backward: autograd thread
    group(1, 2);          // gradients to the previous stage (same ordinal as lane 0's group)
  }
  ASSERT_EQ(log.size(), static_cast<std::size_t>(6 * kPeriods)) << "no call of either thread is dropped";
  const std::vector<PatternCommInfo> comms{{kTp, 2, tp_seq, FALCON_NO_COMM, -1}, {kPp, 2, pp_seq, FALCON_NO_COMM, -1}};
  const Result<CallPatternReport> r = log.Build(6, comms);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // One period, wherever the window starts: two single TP calls and two groups of two PP calls.
  ASSERT_EQ(r.value().pattern.units.size(), 4u) << "tp, group of lane 0, tp, group of lane 1";
  int singles = 0, groups = 0;
  for (const analyzer::CallUnit& u : r.value().pattern.units) {
    ASSERT_EQ(u.calls.size(), 1u);
    if (u.group) {
      ++groups;
      EXPECT_EQ(u.calls[0].count, 2u);
    } else {
      ++singles;
      EXPECT_EQ(u.calls[0].count, 1u);
    }
  }
  EXPECT_EQ(singles, 2);
  EXPECT_EQ(groups, 2);
  // The two lanes' groups with equal ordinals are distinct units even when adjacent.
  CallPatternLog adj;
  FalconRecord g0{}, g1{};
  g0.op = g1.op = kFalconOpGroupStart;
  g1.lane = 1;
  for (int it = 0; it < 3; ++it) {
    for (int lane = 0; lane < 2; ++lane) {
      FalconRecord g = lane == 0 ? g0 : g1;
      g.t_start_ns = t += 10;
      adj.Push(g, 0);
      FalconRecord c{};
      c.op = kFalconOpSend;
      c.lane = static_cast<std::uint8_t>(lane);
      c.comm_seq = pp_seq++;
      c.flags = kFalconFlagInGroup;
      c.t_start_ns = t += 10;
      adj.Push(c, kPp);
    }
  }
  const Result<CallPatternReport> a = adj.Build(2, comms);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a.value().pattern.units.size(), 2u);
}

// One stage of a pipeline whose stages exchange on one communicator of all of them (batched
// sends, as PyTorch's batch_isend_irecv make): its records, numbered as the shim numbers them.
struct StageRun {
  int stage = 0, stages = 3, micro = 4;
  static constexpr std::uint32_t kTpSlot = 0, kPpSlot = 1;
  static constexpr std::uint64_t kPp = 0x9900;
  std::uint64_t seq[2] = {0, 0};
  std::int64_t t = 1000;
  std::vector<FalconRecord> records;

  std::uint64_t TpId() const { return 0x100 + static_cast<std::uint64_t>(stage); }
  void Rec(std::uint8_t op, std::uint32_t slot, std::int32_t peer, bool grouped) {
    FalconRecord r{};
    r.op = op;
    r.comm_slot = slot;
    r.comm_seq = seq[slot]++;
    r.peer = peer;
    r.t_start_ns = t += 10;
    r.flags = grouped ? kFalconFlagInGroup : 0;
    records.push_back(r);
  }
  void Group(std::vector<std::pair<std::uint8_t, std::int32_t>> calls) {
    FalconRecord g{};
    g.op = kFalconOpGroupStart;
    g.comm_slot = FALCON_NO_COMM;
    g.comm_seq = ~std::uint64_t{0};
    g.t_start_ns = t += 10;
    records.push_back(g);
    for (const auto& [op, peer] : calls) Rec(op, kPpSlot, peer, true);
  }
  void Start() {  // both communicators' init
    Rec(kFalconOpCommInitRank, kTpSlot, -1, false);
    Rec(kFalconOpCommInitRank, kPpSlot, -1, false);
  }
  void Iteration() {  // forwards then backwards, each on the stage's TP group, then its exchange
    for (int m = 0; m < micro; ++m) {
      if (stage > 0) Group({{kFalconOpRecv, stage - 1}});
      Rec(kFalconOpAllReduce, kTpSlot, -1, false);
      if (stage < stages - 1) Group({{kFalconOpSend, stage + 1}});
    }
    for (int m = 0; m < micro; ++m) {
      if (stage < stages - 1) Group({{kFalconOpRecv, stage + 1}});
      Rec(kFalconOpAllReduce, kTpSlot, -1, false);
      if (stage > 0) Group({{kFalconOpSend, stage - 1}});
    }
  }
  std::size_t Period() const { return 2 * static_cast<std::size_t>(micro) * (1 + (stage > 0) + (stage < stages - 1)); }
  std::vector<PatternCommInfo> Comms() const {
    return {{TpId(), 1, seq[kTpSlot], kTpSlot, 0}, {kPp, stages, seq[kPpSlot], kPpSlot, stage}};
  }
  CallPatternLog Log(std::size_t from = 0) const {
    CallPatternLog log;
    for (std::size_t i = from; i < records.size(); ++i) {
      const FalconRecord& r = records[i];
      log.Push(r, r.comm_slot == kTpSlot ? TpId() : r.comm_slot == kPpSlot ? kPp : 0);
    }
    return log;
  }
};

// The middle stage of a batched pipeline calls the pipeline communicator twice as often as the
// end stages: its report counts the calls per channel, and the three stages' reports, taken at
// different points of their runs, make a consistent cut.
TEST(CallPatternTest, ChannelsCountSendsAndReceivesPerPeerAndMakeACut) {
  std::vector<StageRun> stages(3);
  std::vector<analyzer::RankCallPattern> patterns;
  for (int s = 0; s < 3; ++s) {
    StageRun& run = stages[static_cast<std::size_t>(s)];
    run.stage = s;
    run.Start();
    for (int it = 0; it < 6 + s; ++it) run.Iteration();  // later stages are iterations ahead
    const CallPatternLog log = run.Log();
    const Result<CallPatternReport> r = log.Build(run.Period(), run.Comms());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const analyzer::RankCallPattern& p = r.value().pattern;
    ASSERT_EQ(p.comms.size(), 2u);
    const analyzer::PatternComm& pp = p.comms[1];
    EXPECT_EQ(pp.rank, s);
    // Init counts as the communicator's one collective; then a send and a receive channel per
    // neighbour, each with the calls before the window.
    std::size_t sends = 0, recvs = 0;
    for (const analyzer::PatternChannel& ch : pp.channels) {
      if (ch.kind == analyzer::ChannelKind::kCollective) {
        EXPECT_EQ(ch.base, 1u);
        continue;
      }
      (ch.kind == analyzer::ChannelKind::kSend ? sends : recvs) += 1;
      // The window is the last period before the last group (which may still be open): one
      // iteration's 4 calls, perhaps with that group's call after it.
      const std::uint64_t total = 4u * static_cast<std::uint64_t>(6 + s);
      EXPECT_GE(total - ch.base, 4u) << "kind " << static_cast<int>(ch.kind) << " peer " << ch.peer;
      EXPECT_LE(total - ch.base, 5u) << "kind " << static_cast<int>(ch.kind) << " peer " << ch.peer;
      EXPECT_EQ(ch.peer == s - 1 || ch.peer == s + 1, true) << ch.peer;
    }
    EXPECT_EQ(sends, s == 1 ? 2u : 1u);
    EXPECT_EQ(recvs, s == 1 ? 2u : 1u);
    EXPECT_EQ(p.comms[0].channels.size(), 1u) << "the TP group: collectives only";
    patterns.push_back(p);
    patterns.back().rank = s;
    patterns.back().min_position = 1;
  }
  const analyzer::CutPlan plan = analyzer::PlanCut(patterns);
  ASSERT_TRUE(plan.ok()) << plan.failure;
  // Where the stages stop, each sends as many to its neighbour as the neighbour receives.
  for (int s = 0; s + 1 < 3; ++s) {
    const auto& lo = patterns[static_cast<std::size_t>(s)];
    const auto& hi = patterns[static_cast<std::size_t>(s + 1)];
    auto at = [&](const analyzer::RankCallPattern& p, analyzer::ChannelKind kind, int peer) {
      const auto& list = p.comms[1].channels;
      for (std::uint32_t k = 0; k < list.size(); ++k) {
        if (list[k].kind == kind && list[k].peer == peer) {
          return analyzer::IssuedOnChannelBefore(p, 1, k, plan.ranks[static_cast<std::size_t>(p.rank)].position);
        }
      }
      return ~std::uint64_t{0};
    };
    EXPECT_EQ(at(lo, analyzer::ChannelKind::kSend, s + 1), at(hi, analyzer::ChannelKind::kRecv, s));
    EXPECT_EQ(at(hi, analyzer::ChannelKind::kSend, s), at(lo, analyzer::ChannelKind::kRecv, s + 1));
  }
}

// Counts are known only from a communicator's first call on, without a gap.
TEST(CallPatternTest, AGapOrALateStartLeavesThatCommunicatorWithoutChannels) {
  StageRun run;
  run.stage = 1;
  run.Start();
  for (int it = 0; it < 5; ++it) run.Iteration();
  // Came late: the log holds nothing of either communicator's start.
  const Result<CallPatternReport> late = run.Log(40).Build(run.Period(), run.Comms());
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  EXPECT_TRUE(late.value().pattern.comms[0].channels.empty());
  EXPECT_TRUE(late.value().pattern.comms[1].channels.empty());
  EXPECT_EQ(late.value().pattern.comms[1].rank, -1);
  // A record of the pipeline communicator lost: that communicator alone loses its channels.
  StageRun lossy = run;
  const auto lost = std::find_if(lossy.records.begin() + 10, lossy.records.end(),
                                 [](const FalconRecord& r) { return r.comm_slot == StageRun::kPpSlot; });
  ASSERT_NE(lost, lossy.records.end());
  lossy.records.erase(lost);
  const Result<CallPatternReport> gap = lossy.Log().Build(run.Period(), run.Comms());
  ASSERT_TRUE(gap.ok()) << gap.status().ToString();
  EXPECT_EQ(gap.value().pattern.comms[0].channels.size(), 1u);
  EXPECT_TRUE(gap.value().pattern.comms[1].channels.empty());
  // A communicator newly created in a slot reused: counted afresh from its comm_seq 0.
  StageRun again = lossy;
  again.seq[StageRun::kPpSlot] = 0;
  again.Rec(kFalconOpCommInitRank, StageRun::kPpSlot, -1, false);
  for (int it = 0; it < 3; ++it) again.Iteration();
  const Result<CallPatternReport> fresh = again.Log().Build(run.Period(), again.Comms());
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(fresh.value().pattern.comms[1].channels.size(), 5u) << "collectives, and a send and a receive per neighbour";
  // Damaged records: a send to no member, or to no peer at all, leaves the communicator without.
  for (std::int32_t peer : {7, -1}) {
    StageRun damaged = run;
    const auto send = std::find_if(damaged.records.begin() + 10, damaged.records.end(),
                                   [](const FalconRecord& r) { return r.op == kFalconOpSend; });
    ASSERT_NE(send, damaged.records.end());
    send->peer = peer;
    const Result<CallPatternReport> d = damaged.Log().Build(run.Period(), run.Comms());
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_TRUE(d.value().pattern.comms[1].channels.empty()) << "peer " << peer;
    EXPECT_EQ(d.value().pattern.comms[0].channels.size(), 1u);
  }
}

FalconRecord Call(std::uint8_t op, std::uint64_t seq, std::uint64_t count, std::int16_t redop = 0, std::int32_t peer = -1) {
  FalconRecord r{};
  r.op = op;
  r.comm_seq = seq;
  r.count = count;
  r.dtype = 7;
  r.redop = redop;
  r.peer = peer;
  return r;
}

TEST(SignatureLogTest, AlikeConsecutiveCallsMakeOneRun) {
  SignatureLog log;
  EXPECT_TRUE(log.empty());
  for (std::uint64_t s = 0; s < 24; ++s) log.Push(Call(kFalconOpAllReduce, s, 4096), 0xa, 2);
  log.Push(Call(kFalconOpAllReduce, 24, 4097), 0xa, 2);                  // another count
  log.Push(Call(kFalconOpAllReduce, 26, 4097), 0xa, 2);                  // a gap in seq (lost)
  log.Push(Call(kFalconOpBroadcast, 27, 4097, -1, 3), 0xa, 2);           // rooted: root kept
  log.Push(Call(kFalconOpAllReduce, 28, 4097, 7), 0xa, 2);               // a user-made reduction
  log.Push(Call(kFalconOpAllGather, 0, 16, -1, 5), 0xb, 4);              // not rooted: peer dropped
  log.Push(Call(kFalconOpCommSplit, 1, 0), 0xb, 4);                      // setup: not compared
  const TakenSignatures t = log.Take();
  const std::vector<protocol::CommSignatures>& c = t.comms;
  EXPECT_EQ(t.dropped, 0u);
  EXPECT_TRUE(t.digests.empty());
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].id, 0xau);
  EXPECT_EQ(c[0].nranks, 2);
  ASSERT_EQ(c[0].runs.size(), 5u);
  EXPECT_EQ(c[0].runs[0].seq, 0u);
  EXPECT_EQ(c[0].runs[0].n, 24u);
  EXPECT_EQ(c[0].runs[0].op, "AllReduce");
  EXPECT_EQ(c[0].runs[0].count, 4096u);
  EXPECT_EQ(c[0].runs[1].seq, 24u);
  EXPECT_EQ(c[0].runs[2].seq, 26u);
  EXPECT_EQ(c[0].runs[3].root, 3);
  EXPECT_EQ(c[0].runs[4].redop, kCustomRedOp);
  ASSERT_EQ(c[1].runs.size(), 1u);
  EXPECT_EQ(c[1].runs[0].root, -1);
  EXPECT_TRUE(log.empty());
  EXPECT_TRUE(log.Take().empty());
}

TEST(SignatureLogTest, PointToPointOnALargerCommunicatorEndsItsComparison) {
  SignatureLog log;
  log.Push(Call(kFalconOpAllReduce, 0, 8), 0xa, 4);
  log.Push(Call(kFalconOpSend, 1, 8, -1, 2), 0xa, 4);   // comm_seq no longer lines up with the others'
  log.Push(Call(kFalconOpAllReduce, 2, 8), 0xa, 4);
  log.Push(Call(kFalconOpSend, 0, 8, -1, 1), 0xb, 2);   // two ranks: sends and receives pair up
  log.Push(Call(kFalconOpAllReduce, 1, 8), 0xb, 2);
  const std::vector<protocol::CommSignatures> c = log.Take().comms;
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].id, 0xbu);
  EXPECT_EQ(c[0].runs[0].seq, 1u);
}

TEST(SignatureLogTest, RunsBeyondTheCapAndLostRecordsAreCounted) {
  SignatureLog log(SignatureLogOptions{.max_runs = 2});
  for (std::uint64_t s = 0; s < 5; ++s) log.Push(Call(kFalconOpAllReduce, s, s), 0xa, 2);
  log.Lost(4);
  const TakenSignatures t = log.Take();
  const std::vector<protocol::CommSignatures>& c = t.comms;
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].runs.size(), 2u);
  EXPECT_EQ(t.dropped, 7u);
  // Out-of-range fields from a damaged record stay within the message's bounds.
  FalconRecord bad = Call(kFalconOpReduce, 0, ~std::uint64_t{0}, -9, -7);
  log.Push(bad, 0xa, 2);
  const std::vector<protocol::CommSignatures> d = log.Take().comms;
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].runs[0].redop, -1);
  EXPECT_EQ(d[0].runs[0].root, -1);
  EXPECT_LE(d[0].runs[0].count, 9'200'000'000'000'000'000ULL);
}

// Calls 0 .. end - 1 on communicator 0xa of 4: AllReduces of 64 elements, but `odd` of 65.
void PushCalls(SignatureLog& log, std::uint64_t from, std::uint64_t end, std::uint64_t odd = ~std::uint64_t{0}) {
  for (std::uint64_t s = from; s < end; ++s) log.Push(Call(kFalconOpAllReduce, s, s == odd ? 65 : 64), 0xa, 4);
}

TEST(SignatureLogTest, PastFullSeqsCompleteBlocksGoOutAsDigests) {
  constexpr std::uint64_t kB = protocol::kSignatureBlockCalls;
  SignatureLog a(SignatureLogOptions{.full_seqs = 1000});  // rounded up to one block
  SignatureLog b(SignatureLogOptions{.full_seqs = 1000});
  SignatureLog c(SignatureLogOptions{.full_seqs = 1000});
  PushCalls(a, 0, 5 * kB + 1);
  PushCalls(b, 0, 5 * kB + 1, /*odd=*/2 * kB + 5);
  // Read in another order within blocks (records of two threads): the digest is the same.
  for (std::uint64_t blk = 0; blk <= 5; ++blk) {
    for (std::uint64_t s = std::min((blk + 1) * kB, 5 * kB + 1); s-- > blk * kB;) {
      c.Push(Call(kFalconOpAllReduce, s, 64), 0xa, 4);
    }
  }
  const TakenSignatures ta = a.Take();
  const TakenSignatures tb = b.Take();
  const TakenSignatures tc = c.Take();
  ASSERT_EQ(ta.comms.size(), 1u);
  ASSERT_EQ(ta.comms[0].runs.size(), 1u);
  EXPECT_EQ(ta.comms[0].runs[0].n, kB) << "block 0 call by call";
  ASSERT_EQ(ta.digests.size(), 1u);
  EXPECT_EQ(ta.digests[0].id, 0xau);
  EXPECT_EQ(ta.digests[0].nranks, 4);
  // Blocks 4 and 5 are open: the newest two stay until a call two blocks on arrives.
  ASSERT_EQ(ta.digests[0].blocks.size(), 3u);
  ASSERT_EQ(tb.digests[0].blocks.size(), 3u);
  ASSERT_EQ(tc.digests[0].blocks.size(), 3u);
  for (std::size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(ta.digests[0].blocks[k].seq, (k + 1) * kB);
    EXPECT_EQ(ta.digests[0].blocks[k].n, kB);
    EXPECT_EQ(tc.digests[0].blocks[k].digest, ta.digests[0].blocks[k].digest) << k;
    EXPECT_EQ(tb.digests[0].blocks[k].digest == ta.digests[0].blocks[k].digest, k != 1) << k;
  }
  // The message carries them, and a reader that validates accepts it.
  protocol::CallSignatures m;
  m.header = {"job", "node0", 1};
  m.rank = 0;
  m.pid = 1000;
  m.comms = ta.comms;
  m.digests = ta.digests;
  const nlohmann::json j = nlohmann::json::parse(protocol::Dump(m));
  EXPECT_EQ(j, protocol::ToJson(m));
  const Status valid = protocol::ValidateMessage(j, protocol::kCallSignatures);
  EXPECT_TRUE(valid.ok()) << valid.message();
}

TEST(SignatureLogTest, AnIdleCommunicatorSendsItsHeldCallsInFullOnce) {
  constexpr std::uint64_t kB = protocol::kSignatureBlockCalls;
  SignatureLog log(SignatureLogOptions{.full_seqs = 0});
  PushCalls(log, 0, 2 * kB + 100, /*odd=*/2 * kB + 50);
  const TakenSignatures busy = log.Take();
  EXPECT_TRUE(busy.comms.empty()) << "still issuing: nothing in full";
  ASSERT_EQ(busy.digests.size(), 1u);
  EXPECT_EQ(busy.digests[0].blocks.size(), 1u);
  EXPECT_FALSE(log.empty());
  const TakenSignatures idle = log.Take();  // nothing issued since: the job may be stuck here
  ASSERT_EQ(idle.comms.size(), 1u);
  const std::vector<protocol::SignatureRun>& runs = idle.comms[0].runs;
  ASSERT_FALSE(runs.empty());
  EXPECT_EQ(runs.front().seq, kB) << "the open blocks, 1 and 2";
  EXPECT_EQ(runs.back().seq + runs.back().n, 2 * kB + 100);
  std::uint64_t calls = 0;
  bool odd_seen = false;
  for (const protocol::SignatureRun& r : runs) {
    calls += r.n;
    odd_seen = odd_seen || (r.seq == 2 * kB + 50 && r.n == 1 && r.count == 65);
  }
  EXPECT_EQ(calls, kB + 100);
  EXPECT_TRUE(odd_seen);
  EXPECT_TRUE(log.empty());
  EXPECT_TRUE(log.Take().empty()) << "sent once";
  // It resumes: new calls do not repeat the sent ones, and an idle spell sends only the new.
  PushCalls(log, 2 * kB + 100, 2 * kB + 110);
  EXPECT_TRUE(log.Take().comms.empty());
  const TakenSignatures again = log.Take();
  ASSERT_EQ(again.comms.size(), 1u);
  ASSERT_EQ(again.comms[0].runs.size(), 1u);
  EXPECT_EQ(again.comms[0].runs[0].seq, 2 * kB + 100);
  EXPECT_EQ(again.comms[0].runs[0].n, 10u);
}

TEST(SignatureLogTest, LostRecordsKeepTheirBlocksDigestsBack) {
  constexpr std::uint64_t kB = protocol::kSignatureBlockCalls;
  SignatureLog log(SignatureLogOptions{.full_seqs = 0});
  PushCalls(log, 0, kB + 500);  // blocks 0 and 1 open
  log.Lost(3);
  PushCalls(log, kB + 503, 4 * kB + 1);  // closes 0, 1 (lost in them) and 2
  const TakenSignatures t = log.Take();
  EXPECT_EQ(t.dropped, 3u);
  ASSERT_EQ(t.digests.size(), 1u);
  ASSERT_EQ(t.digests[0].blocks.size(), 1u);
  EXPECT_EQ(t.digests[0].blocks[0].seq, 2 * kB);
  // A call of block 2 read after block 2 went out (block 4 is newest): counted, not hidden.
  log.Push(Call(kFalconOpAllReduce, 2 * kB + 1, 64), 0xa, 4);
  EXPECT_EQ(log.Take().dropped, 1u);
}

TEST(SignatureLogTest, ABlockWhoseStartWasNotSeenIsNotSent) {
  constexpr std::uint64_t kB = protocol::kSignatureBlockCalls;
  // An agent (re)started while the job ran: its first call of the communicator is mid-block.
  SignatureLog late(SignatureLogOptions{.full_seqs = 0});
  PushCalls(late, kB + 500, 5 * kB + 1);
  const TakenSignatures t = late.Take();
  ASSERT_EQ(t.digests.size(), 1u);
  ASSERT_EQ(t.digests[0].blocks.size(), 2u);
  EXPECT_EQ(t.digests[0].blocks[0].seq, 2 * kB) << "block 1 lacks its first 500 calls";
  // Records lost right at a block boundary: the block after them lacks its first calls too.
  SignatureLog log(SignatureLogOptions{.full_seqs = 0});
  PushCalls(log, 0, 2 * kB);
  log.Lost(2);  // seqs 2 kB and 2 kB + 1
  PushCalls(log, 2 * kB + 2, 5 * kB + 1);
  const TakenSignatures u = log.Take();
  ASSERT_EQ(u.digests.size(), 1u);
  ASSERT_EQ(u.digests[0].blocks.size(), 1u);
  EXPECT_EQ(u.digests[0].blocks[0].seq, 3 * kB);
}

TEST(OutboxTest, BoundedOldestDroppedConfirmedBySequence) {
  Outbox box(3);
  for (int i = 0; i < 5; ++i) box.Push("s", std::to_string(i));
  EXPECT_EQ(box.size(), 3u);
  EXPECT_EQ(box.dropped(), 2u);
  std::vector<OutEntry> peek = box.Peek(2);
  ASSERT_EQ(peek.size(), 2u);
  EXPECT_EQ(peek[0].payload, "2");
  box.Push("s", "5");  // overflows while a flush of `peek` is in flight
  box.ConfirmThrough(peek.back().seq);
  ASSERT_EQ(box.size(), 2u);
  EXPECT_EQ(box.Peek(10)[0].payload, "4");
  EXPECT_EQ(box.confirmed(), 1u) << "entry 2 was dropped, only 3 was confirmed";
}

TEST(CommandExecutorTest, ExpiredAndUntargetedCommandsAreAnsweredAtOnce) {
  std::vector<std::string> acks;
  CommandExecutor ex(std::make_unique<UnsupportedTrap>(), std::chrono::milliseconds(100),
                     [&](const std::string& id, const protocol::Command& c, const CommandOutcome& o) {
                       acks.push_back(id + ":" + c.type + ":" + o.status);
                     });
  protocol::Command c;
  c.type = "pause";
  c.id = "p";
  c.deadline_ns = 10;
  ex.Execute("1-0", c, {}, 20, CommandExecutor::Clock::now());
  c.deadline_ns.reset();
  ex.Execute("2-0", c, {}, 20, CommandExecutor::Clock::now());
  ASSERT_EQ(acks.size(), 2u);
  EXPECT_EQ(acks[0], "1-0:pause:expired");
  EXPECT_EQ(acks[1], "2-0:pause:rejected");
  EXPECT_EQ(ex.pending(), 0u);
}

TEST(CommandExecutorTest, PlansTooLargeForSharedMemoryAreRejectedOthersAreHeld) {
  std::vector<CommandOutcome> acks;
  CommandExecutor ex(std::make_unique<UnsupportedTrap>(), std::chrono::milliseconds(100),
                     [&](const std::string&, const protocol::Command&, const CommandOutcome& o) { acks.push_back(o); });
  protocol::Command c;
  c.type = "plan";
  c.id = "p";
  c.plan_version = 4;
  c.strategy = "S4";
  c.placement.assign(FALCON_PLAN_MAX_PLACEMENT + 1, 0);
  ex.Execute("1-0", c, {}, 20, CommandExecutor::Clock::now());
  c.placement.assign(8, 1);
  c.exclude_nodes.assign(FALCON_PLAN_MAX_EXCLUDE + 1, 1);
  ex.Execute("2-0", c, {}, 20, CommandExecutor::Clock::now());
  c.exclude_nodes = {1};
  c.restart = true;
  ex.Execute("3-0", c, {}, 20, CommandExecutor::Clock::now());  // nobody here yet: held
  ASSERT_EQ(acks.size(), 3u);
  EXPECT_EQ(acks[0].status, "rejected");
  EXPECT_NE(acks[0].detail.find("placement has 16385 entries"), std::string::npos) << acks[0].detail;
  EXPECT_NE(acks[0].detail.find("FALCON_PLAN_MAX_PLACEMENT"), std::string::npos);
  EXPECT_EQ(acks[1].status, "rejected");
  EXPECT_NE(acks[1].detail.find("FALCON_PLAN_MAX_EXCLUDE"), std::string::npos) << acks[1].detail;
  EXPECT_EQ(acks[2].status, "ok");
  EXPECT_TRUE(acks[2].ranks.empty());
  EXPECT_NE(acks[2].detail.find("held for ranks that start later"), std::string::npos) << acks[2].detail;
  EXPECT_EQ(ex.CatchUpPlans({}, 30, {}), 0u);
  EXPECT_EQ(StrategyCode("S3"), static_cast<std::uint32_t>(kFalconStrategyTopology));
  EXPECT_EQ(StrategyCode("S9"), static_cast<std::uint32_t>(kFalconStrategyNone));
}

TEST(MetricsTest, PrometheusTextHasEveryFamilyAndRankLabels) {
  AgentMetrics m;
  m.job = "j";
  m.host = "h\"x";
  m.ranks = {{3, 100, 0.25, 40, 9, true, 5, 4, 5}};
  m.alarms_slow = 2;
  m.segments["live"] = 1;
  m.redis_connected = true;
  m.cpu_seconds = 1.5;
  const std::string text = RenderPrometheus(m);
  for (const char* want :
       {"falcon_agent_iteration_seconds{job=\"j\",host=\"h\\\"x\",rank=\"3\",pid=\"100\"} 0.25",
        "falcon_agent_alarms_total{job=\"j\",host=\"h\\\"x\",kind=\"slow\"} 2",
        "falcon_agent_rank_slow{job=\"j\",host=\"h\\\"x\",rank=\"3\",pid=\"100\"} 1",
        "falcon_agent_plan_version{job=\"j\",host=\"h\\\"x\",rank=\"3\",pid=\"100\",state=\"applied\"} 4",
        "falcon_agent_plan_version{job=\"j\",host=\"h\\\"x\",rank=\"3\",pid=\"100\",state=\"rejected\"} 5",
        "falcon_agent_segments{job=\"j\",host=\"h\\\"x\",state=\"live\"} 1",
        "falcon_agent_redis_connected{job=\"j\",host=\"h\\\"x\"} 1",
        "falcon_agent_cpu_seconds_total{job=\"j\",host=\"h\\\"x\"} 1.5",
        "# TYPE falcon_agent_records_lost_total counter"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
}

// ---- StallWatch ------------------------------------------------------------------------------

constexpr std::int64_t kSec = 1'000'000'000;

// A rank with one communicator: `issued` calls, `completed` of them done on the device, the last
// issued at `last_s` (monotonic seconds).
daemon::SegmentProgress Rank(std::uint64_t issued, std::uint64_t completed, double last_s, bool known = true) {
  daemon::SegmentProgress p;
  p.progress.rank = 3;
  analyzer::CommProgress c;
  c.comm = 0xaa;
  c.nranks = 2;
  c.comm_rank = 1;
  c.issued = issued;
  c.completed = completed;
  c.completion_known = known;
  p.progress.comms.push_back(c);
  for (std::uint64_t s = issued >= 3 ? issued - 3 : 0; s < issued; ++s) {
    analyzer::IssuedCall call;
    call.comm = 0xaa;
    call.seq = s;
    call.sig.op = kFalconOpAllReduce;
    call.completed = s < completed;
    call.issue_ns = static_cast<std::int64_t>(s);
    p.progress.recent.push_back(call);
  }
  p.last_call_mono_ns = static_cast<std::int64_t>(last_s * kSec);
  p.device_tracked = known;
  return p;
}

TEST(StallWatchTest, PendingDeviceWorkPastTheBoundIsAStallAndItsEndIsReported) {
  StallWatch w(StallOptions{5.0, 4.0});
  const daemon::SegmentProgress p = Rank(10, 9, 100);
  EXPECT_FALSE(w.Update(p, static_cast<std::int64_t>(104.9 * kSec), 0.1)) << "within the floor";
  const auto e = w.Update(p, static_cast<std::int64_t>(105.1 * kSec), 0.1);
  ASSERT_TRUE(e);
  EXPECT_TRUE(e->stalled);
  EXPECT_NEAR(e->age_s, 5.1, 1e-9);
  EXPECT_DOUBLE_EQ(e->bound_s, 5.0);
  EXPECT_EQ(e->waiting_in.comm, 0xaau);
  ASSERT_TRUE(e->waiting_in.seq);
  EXPECT_EQ(*e->waiting_in.seq, 9u);  // the first call not completed
  EXPECT_EQ(e->waiting_in.op, kFalconOpAllReduce);
  EXPECT_FALSE(e->waiting_in.in_host_call);
  EXPECT_FALSE(w.Update(p, 200 * kSec, 0.1)) << "reported once";
  EXPECT_TRUE(w.stalled());
  const auto back = w.Update(Rank(11, 11, 201), 201 * kSec + 1000, 0.1);
  ASSERT_TRUE(back);
  EXPECT_FALSE(back->stalled);
  EXPECT_EQ(w.stalls(), 1u);
}

TEST(StallWatchTest, TheBoundScalesWithTheRanksIterationTime) {
  StallWatch w(StallOptions{5.0, 4.0});
  EXPECT_DOUBLE_EQ(w.bound_s(0), 120.0) << "no iteration time yet: the startup bound";
  EXPECT_DOUBLE_EQ(w.bound_s(0.5), 5.0);
  EXPECT_DOUBLE_EQ(w.bound_s(3.0), 12.0);
  const daemon::SegmentProgress p = Rank(10, 9, 1);
  EXPECT_FALSE(w.Update(p, 12 * kSec, 3.0)) << "a 3 s iteration: 11 s quiet is within 4 iterations";
  EXPECT_TRUE(w.Update(p, 14 * kSec, 3.0));
  StallWatch starting(StallOptions{5.0, 4.0, 120.0});
  EXPECT_FALSE(starting.Update(p, 61 * kSec, 0)) << "no iteration time yet: a slow start is not a hang";
  EXPECT_TRUE(starting.Update(p, 122 * kSec, 0));
}

TEST(StallWatchTest, IdleOutsideNcclPausedOrInAPhaseIsNeverAStall) {
  StallWatch w(StallOptions{1.0, 4.0, 1.0});
  // A long checkpoint or the end of training: every call completed, no thread in NCCL.
  EXPECT_FALSE(w.Update(Rank(10, 10, 1), 3600 * kSec, 0.1));
  daemon::SegmentProgress paused = Rank(10, 9, 1);
  paused.paused = true;
  EXPECT_FALSE(w.Update(paused, 3600 * kSec, 0.1)) << "held by a Falcon pause";
  daemon::SegmentProgress checkpoint = Rank(10, 9, 1);
  checkpoint.phase = kFalconPhaseCheckpoint;
  EXPECT_FALSE(w.Update(checkpoint, 3600 * kSec, 0.1)) << "the framework says it checkpoints";
  EXPECT_FALSE(w.Update(daemon::SegmentProgress{}, 3600 * kSec, 0.1)) << "no call ever";
  EXPECT_FALSE(w.stalled());
  EXPECT_TRUE(w.Update(Rank(10, 9, 1), 3600 * kSec, 0.1)) << "the same rank with work pending is";
  EXPECT_EQ(w.stalls(), 1u);
}

TEST(StallWatchTest, UntrackedCompletionCountsOnlyHostCallsThatDoNotReturn) {
  StallWatch w(StallOptions{1.0, 4.0, 1.0});
  daemon::SegmentProgress p = Rank(10, 0, 1, /*known=*/false);
  EXPECT_FALSE(w.Update(p, 60 * kSec, 0.1)) << "completion unknown, no thread in NCCL: not judged";
  p.progress.in_call = 0xaa;  // a blocking call on it never returned
  const auto e = w.Update(p, 61 * kSec, 0.1);
  ASSERT_TRUE(e);
  EXPECT_TRUE(e->waiting_in.in_host_call);
  EXPECT_EQ(e->waiting_in.comm, 0xaau);
  ASSERT_TRUE(e->waiting_in.seq);
  EXPECT_EQ(*e->waiting_in.seq, 9u);  // the latest issued: the call in flight
  daemon::SegmentProgress init = Rank(0, 0, 0, false);
  init.last_call_mono_ns = 1;
  init.progress.in_call = 0;  // an ncclGroupEnd or an init: no known communicator
  StallWatch w2(StallOptions{1.0, 4.0, 1.0});
  const auto e2 = w2.Update(init, 60 * kSec, 0);
  ASSERT_TRUE(e2);
  EXPECT_EQ(e2->waiting_in.comm, 0u);
  EXPECT_FALSE(e2->waiting_in.seq);
}

TEST(StallWatchTest, TheOldestPendingCallByIssueTimeIsTheOneWaitedIn) {
  daemon::SegmentProgress p = Rank(10, 9, 0);
  analyzer::CommProgress other;
  other.comm = 0xbb;
  other.nranks = 4;
  other.issued = 5;
  other.completed = 4;
  p.progress.comms.push_back(other);
  analyzer::IssuedCall call;
  call.comm = 0xbb;
  call.seq = 4;
  call.sig.op = kFalconOpReduceScatter;
  call.issue_ns = -5;  // before the AllReduce #9 (issue_ns 9)
  p.progress.recent.insert(p.progress.recent.begin(), call);
  const auto c = OutstandingCall(p);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->comm, 0xbbu);
  EXPECT_EQ(*c->seq, 4u);
  EXPECT_EQ(c->op, kFalconOpReduceScatter);
  p.progress.recent.erase(p.progress.recent.begin());  // its call left the read window
  const auto d = OutstandingCall(p);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->comm, 0xbbu) << "a pending call older than the window is older than any in it";
  EXPECT_EQ(*d->seq, 4u);
}

TEST(AgentMetricsTest, StalledRanksAreExposed) {
  AgentMetrics m;
  m.job = "j";
  m.host = "h";
  RankMetrics r;
  r.rank = 5;
  r.pid = 77;
  r.stalled = true;
  r.quiet_seconds = 12.5;
  m.ranks.push_back(r);
  m.stalls = 2;
  m.stalls_ended = 1;
  const std::string text = RenderPrometheus(m);
  EXPECT_NE(text.find("falcon_agent_rank_stalled{job=\"j\",host=\"h\",rank=\"5\",pid=\"77\"} 1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("falcon_agent_rank_quiet_seconds{job=\"j\",host=\"h\",rank=\"5\",pid=\"77\"} 12.5"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("falcon_agent_stalls_total{job=\"j\",host=\"h\",kind=\"stalled\"} 2"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace falcon::agent
