// `falcon-ctl analyze-trace`: runs the analyzer's detection core offline on a file.
//  - CSV mode (default): `iter,seconds[,label]` per line (label ignored) -> BOCD + verification
//    -> alarms. `--json` prints {"schema": 1, "alarms": [{"at", "onset", "type", "ratio", ...}]}.
//  - Record mode (`--records`, or a .jsonl/.ndjson file): call records from
//    `falcon-ctl trace PID --json`, grouped by pid -> signatures -> period (tracked, re-locked on
//    change) -> iteration times -> alarms, per process. Iteration times outside the readers'
//    plausible bounds (analyze_trace_input.h) are left out with a warning on stderr, so every
//    ratio printed is finite (never inf, never null in JSON).
// Exit: 0 on success whatever was found (scripts that want a status use --fail-on-alarm, which
// exits kExitFound when a slow alarm was raised); kExitInput for a missing or malformed input.
// Single-threaded; reads one file (or stdin for "-"); never writes files.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "analyzer/detector.h"
#include "analyzer/iteration_series.h"
#include "analyzer/period_tracker.h"
#include "analyzer/signature.h"
#include "daemon/common/cli_checks.h"
#include "daemon/ctl/analyze_trace_input.h"
#include "daemon/ctl/command.h"

namespace falcon::ctl {
namespace {

constexpr int kSchemaVersion = 1;

struct AnalyzeOptions {
  std::string file;
  bool json = false;
  bool records = false;
  bool fail_on_alarm = false;
  bool no_verify = false;
  analyzer::DetectorOptions detector;
  analyzer::PeriodTrackerOptions tracker;
};

const char* TypeName(analyzer::AlarmType t) {
  return t == analyzer::AlarmType::kSlow ? "slow" : "recovered";
}

std::vector<analyzer::Alarm> Detect(const std::vector<double>& seconds,
                                    const analyzer::DetectorOptions& options) {
  analyzer::FailSlowDetector detector(options);
  std::vector<analyzer::Alarm> alarms;
  for (double s : seconds) {
    const analyzer::DetectorStep step = detector.Push(s);
    if (step.alarm) {
      alarms.push_back(*step.alarm);
    }
  }
  return alarms;
}

nlohmann::json AlarmsJson(const std::vector<analyzer::Alarm>& alarms) {
  nlohmann::json out = nlohmann::json::array();
  for (const analyzer::Alarm& a : alarms) {
    out.push_back({{"at", a.at}, {"onset", a.onset}, {"type", TypeName(a.type)},
                   {"ratio", a.ratio}, {"probability", a.probability},
                   {"level_s", a.level_seconds}});
  }
  return out;
}

void PrintPreamble(const AnalyzeOptions& o, const char* mode) {
  const analyzer::DetectorOptions& d = o.detector;
  std::printf("# falcon-ctl analyze-trace 0.1.0 (schema %d)\n", kSchemaVersion);
  std::printf("# input: %s (%s)\n", o.file.c_str(), mode);
  std::printf("# detector: %s, hazard 1/%.0f, threshold %.2f, min change %.0f %%, window %zu,"
              " spike run <= %zu, outlier z %.1f, confidence z %.2f, rho floor %.2f\n",
              d.verify ? "BOCD+V" : "plain BOCD", 1.0 / d.bocd.hazard, d.cp_threshold,
              100.0 * d.min_change, d.window, d.max_outlier_run, d.outlier_z, d.confidence_z,
              d.rho_floor);
}

void PrintAlarmTable(const std::vector<analyzer::Alarm>& alarms) {
  std::printf("%10s %10s %-10s %8s %12s %8s\n", "at(iter)", "onset", "type", "ratio(x)",
              "level(s)", "p(cp)");
  for (const analyzer::Alarm& a : alarms) {
    std::printf("%10llu %10llu %-10s %8.3f %12.6f %8.3f\n",
                static_cast<unsigned long long>(a.at), static_cast<unsigned long long>(a.onset),
                TypeName(a.type), a.ratio, a.level_seconds, a.probability);
  }
}

std::size_t CountSlow(const std::vector<analyzer::Alarm>& alarms) {
  return static_cast<std::size_t>(std::count_if(alarms.begin(), alarms.end(), [](const auto& a) {
    return a.type == analyzer::AlarmType::kSlow;
  }));
}

int RunCsv(const AnalyzeOptions& o, std::istream& in) {
  CsvTrace trace;
  std::string error;
  if (!ReadCsvTrace(in, trace, error)) {
    std::fprintf(stderr, "falcon-ctl analyze-trace: %s: %s\n", o.file.c_str(), error.c_str());
    return kExitInput;
  }
  const std::vector<analyzer::Alarm> alarms = Detect(trace.seconds, o.detector);
  const std::size_t slow = CountSlow(alarms);
  if (o.json) {
    const nlohmann::json out = {{"schema", kSchemaVersion},
                                {"iterations", trace.seconds.size()},
                                {"alarms", AlarmsJson(alarms)}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    PrintPreamble(o, "iteration-time CSV");
    PrintAlarmTable(alarms);
    std::printf("# summary: %zu iterations, %zu alarms (%zu slow, %zu recovered)\n",
                trace.seconds.size(), alarms.size(), slow, alarms.size() - slow);
  }
  return o.fail_on_alarm && slow > 0 ? kExitFound : kExitOk;
}

struct ProcessResult {
  std::int64_t pid = -1;
  std::vector<std::pair<std::size_t, double>> periods;  // (period, acf) per lock
  std::vector<double> seconds;
  std::size_t implausible = 0;  // iteration times outside the plausible bounds, left out
  std::vector<analyzer::Alarm> alarms;
};

// Signatures -> tracked period segments -> iteration times -> alarms, for one process.
ProcessResult AnalyzeProcess(std::int64_t pid, const std::vector<analyzer::CallRecord>& calls,
                             const AnalyzeOptions& o) {
  ProcessResult r;
  r.pid = pid;
  analyzer::SignatureTable table;
  const analyzer::SignatureSequence seq = analyzer::MakeSignatureSequence(calls, table);
  analyzer::PeriodTracker tracker(o.tracker);
  struct Lock {
    std::size_t from, to, period;
    std::vector<bool> ignored;
  };
  std::vector<Lock> locks;
  for (std::size_t i = 0; i < seq.symbols.size(); ++i) {
    const analyzer::TrackerEvent e = tracker.Push(seq.symbols[i], i);
    if (e == analyzer::TrackerEvent::kLocked) {
      locks.push_back({static_cast<std::size_t>(tracker.locked_from()), seq.symbols.size(),
                       tracker.period(), tracker.ignored()});
      r.periods.emplace_back(tracker.period(), tracker.acf());
    } else if (e == analyzer::TrackerEvent::kRefined && !locks.empty()) {
      locks.back().ignored = tracker.ignored();  // offline: the whole segment ignores them
    } else if (e == analyzer::TrackerEvent::kLost && !locks.empty()) {
      locks.back().to = static_cast<std::size_t>(tracker.lost_at()) + 1;
    }
  }
  for (const Lock& lock : locks) {  // one iteration series per locked segment, concatenated
    std::vector<std::uint32_t> symbols;
    std::vector<std::int64_t> times;
    for (std::size_t i = lock.from; i < std::min(lock.to, seq.symbols.size()); ++i) {
      const std::uint32_t s = seq.symbols[i];
      if (s < lock.ignored.size() && lock.ignored[s]) {
        continue;
      }
      symbols.push_back(s);
      times.push_back(seq.t_ns[i]);
    }
    for (const auto& sample : analyzer::ExtractIterations(symbols, times, lock.period)) {
      if (PlausibleIterationSeconds(sample.seconds)) {
        r.seconds.push_back(sample.seconds);
      } else {
        ++r.implausible;  // 0 s or days: the records' times are wrong, and would skew every ratio
      }
    }
  }
  r.alarms = Detect(r.seconds, o.detector);
  return r;
}

int RunRecords(const AnalyzeOptions& o, std::istream& in) {
  RecordDump dump;
  std::string error;
  if (!ReadRecordDump(in, dump, error)) {
    std::fprintf(stderr, "falcon-ctl analyze-trace: %s: %s\n", o.file.c_str(), error.c_str());
    return kExitInput;
  }
  std::vector<ProcessResult> results;
  for (const auto& [pid, calls] : dump.by_pid) {
    results.push_back(AnalyzeProcess(pid, calls, o));
  }
  std::size_t slow = 0;
  nlohmann::json all = nlohmann::json::array();
  nlohmann::json procs = nlohmann::json::array();
  for (const ProcessResult& r : results) {
    if (r.implausible > 0) {
      std::fprintf(stderr,
                   "falcon-ctl analyze-trace: warning: pid %lld: %zu iteration time(s) outside %g..%g s left out "
                   "(are the records' t_start_ns values right?)\n",
                   static_cast<long long>(r.pid), r.implausible, kMinIterationSeconds, kMaxIterationSeconds);
    }
    slow += CountSlow(r.alarms);
    nlohmann::json periods = nlohmann::json::array();
    for (const auto& [p, acf] : r.periods) {
      periods.push_back({{"period", p}, {"acf", acf}});
    }
    nlohmann::json alarms = AlarmsJson(r.alarms);
    for (auto& a : alarms) {
      a["pid"] = r.pid;
      all.push_back(a);
    }
    procs.push_back({{"pid", r.pid}, {"periods", periods}, {"iteration_seconds", r.seconds},
                     {"implausible_iterations", r.implausible}, {"alarms", AlarmsJson(r.alarms)}});
  }
  if (o.json) {
    const nlohmann::json out = {{"schema", kSchemaVersion}, {"processes", procs}, {"alarms", all}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    PrintPreamble(o, "call-record dump");
    for (const ProcessResult& r : results) {
      std::printf("# pid %lld: %zu period lock(s):", static_cast<long long>(r.pid),
                  r.periods.size());
      for (const auto& [p, acf] : r.periods) {
        std::printf(" %zu calls/iter (acf %.3f)", p, acf);
      }
      std::printf("\n%10s %14s\n", "iter", "seconds");
      for (std::size_t i = 0; i < r.seconds.size(); ++i) {
        std::printf("%10zu %14.6f\n", i, r.seconds[i]);
      }
      PrintAlarmTable(r.alarms);
    }
    std::printf("# summary: %zu records, %zu process(es), %zu slow alarm(s)\n", dump.lines,
                results.size(), slow);
  }
  return o.fail_on_alarm && slow > 0 ? kExitFound : kExitOk;
}

bool LooksLikeRecords(const std::string& file) {
  auto ends = [&](const std::string& ext) {
    return file.size() >= ext.size() && file.compare(file.size() - ext.size(), ext.size(), ext) == 0;
  };
  return ends(".jsonl") || ends(".ndjson");
}

int Run(AnalyzeOptions o) {
  o.detector.verify = !o.no_verify;
  std::ifstream file;
  std::istream* in = &std::cin;
  if (o.file != "-") {
    file.open(o.file);
    if (!file) {
      std::fprintf(stderr, "falcon-ctl analyze-trace: cannot open '%s'\n", o.file.c_str());
      return kExitInput;
    }
    in = &file;
  }
  return o.records || LooksLikeRecords(o.file) ? RunRecords(o, *in) : RunCsv(o, *in);
}

}  // namespace

void AddAnalyzeTraceCommand(CLI::App& app, CommandContext& ctx) {
  auto opts = std::make_shared<AnalyzeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "analyze-trace",
      "Detect fail-slows offline: BOCD + verification on an iteration-time CSV "
      "(iter,seconds[,label]) or on a call-record dump (JSON lines of `falcon-ctl trace --json`)");
  cmd->add_option("file", opts->file, "input file, or - for stdin")->required();
  cmd->add_flag("--json", opts->json, "print one JSON document instead of the table");
  cmd->add_flag("--records", opts->records,
                "input is a call-record dump (default for .jsonl/.ndjson files)");
  cmd->add_flag("--no-verify", opts->no_verify,
                "plain BOCD: no spike/pause filter, no min-change verification");
  cmd->add_flag("--fail-on-alarm", opts->fail_on_alarm, "exit 1 when a slow alarm was raised");
  analyzer::DetectorOptions& d = opts->detector;
  cmd->add_option("--hazard", d.bocd.hazard, "BOCD constant hazard (prior change rate)")
      ->capture_default_str()->check(daemon::FiniteRange(1e-9, 0.5));
  cmd->add_option("--threshold", d.cp_threshold, "posterior probability to report a change")
      ->capture_default_str()->check(daemon::FiniteRange(0.0, 1.0));
  cmd->add_option("--min-change", d.min_change, "verification: relative change of the median")
      ->capture_default_str()->check(daemon::FiniteRange(0.0, 10.0));
  cmd->add_option("--window", d.window, "a change point is sought in the last N samples")
      ->capture_default_str()->check(daemon::FiniteRange(2, 192));
  cmd->add_option("--max-spike-run", d.max_outlier_run,
                  "outlier runs up to this length are dropped as spikes/pauses")
      ->capture_default_str()->check(daemon::FiniteRange(0, 16));
  cmd->add_option("--outlier-z", d.outlier_z, "robust sigmas from the level that make an outlier")
      ->capture_default_str()->check(daemon::FiniteRange(1.0, 100.0));
  cmd->add_option("--confidence-z", d.confidence_z,
                  "verification margin in standard errors of the post-change median")
      ->capture_default_str()->check(daemon::FiniteRange(0.0, 10.0));
  cmd->add_option("--min-post", d.min_post, "samples after a change point before it is verified")
      ->capture_default_str()->check(daemon::FiniteRange(1, 64));
  cmd->add_option("--spread-z", d.level_spread_z,
                  "a rise is verified when the post-change spread is <= this many sigmas (0: off)")
      ->capture_default_str()->check(daemon::FiniteRange(0.0, 100.0));
  cmd->add_option("--rho-floor", d.rho_floor,
                  "correlated noise widens the margin above this lag-1 autocorrelation (1: never)")
      ->capture_default_str()->check(daemon::FiniteRange(0.0, 1.0));
  cmd->add_option("--baseline-clip-z", d.baseline_clip_z,
                  "a healthy sample above the baseline raises it by at most this many sigmas (0: plain mean)")
      ->capture_default_str()->check(daemon::FiniteRange(0.0, 100.0));
  cmd->add_option("--max-hypotheses", d.bocd.max_hypotheses, "BOCD run lengths kept")
      ->capture_default_str()->check(daemon::FiniteRange(4, 4096));
  cmd->add_option("--acf-threshold", opts->tracker.period.acf_threshold,
                  "records mode: match rate that locks a period")
      ->capture_default_str()->check(daemon::FiniteRange(0.5, 1.0));
  cmd->callback([opts, &ctx] { ctx.exit_code = Run(*opts); });
}

}  // namespace falcon::ctl
