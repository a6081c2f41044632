// `falcon-ctl dump`: every traced process's progress on its communicators and its latest calls,
// read live from the shim segments on this machine — a Flight Recorder that needs no timeout and
// no crash. --json writes the progress document (progress_json.h) that `falcon-ctl hang
// --progress` diagnoses, with a few extra keys per rank for people and scripts.
// Single-threaded; reads segments only.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "daemon/common/cli_checks.h"
#include "daemon/ctl/command.h"
#include "daemon/ctl/local_progress.h"
#include "daemon/shm/progress_json.h"
#include "daemon/shm/record_json.h"

namespace falcon::ctl {
namespace {

struct DumpOptions {
  LocalProgressOptions local;
  std::size_t calls = 16;
  bool json = false;
  std::string output;
};

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

void PrintTable(const std::vector<LocalRank>& ranks, const std::string& dir, std::FILE* out) {
  std::fprintf(out, "# falcon-ctl dump  dir %s  %zu process(es)\n", dir.c_str(), ranks.size());
  for (const LocalRank& lr : ranks) {
    const daemon::SegmentProgress& sp = lr.progress;
    const analyzer::RankProgress& p = sp.progress;
    const double last = lr.AgeSeconds(sp.last_call_mono_ns);
    std::string in_call = "-";
    if (p.in_call) {
      in_call = (*p.in_call == 0 ? std::string("a call on no known communicator") : daemon::HexId(*p.in_call)) +
                " for " + Seconds(lr.AgeSeconds(sp.in_call_since_mono_ns));
    }
    std::fprintf(out, "rank %lld  pid %d  host %s  %s%s  last call %s  in call %s  device completion %s\n",
                 static_cast<long long>(p.rank), lr.info.pid, p.host.c_str(), daemon::SegmentStateName(lr.info.state),
                 sp.paused ? " (paused by Falcon)" : "",
                 last < 0 ? "never" : (Seconds(last) + " ago").c_str(), in_call.c_str(),
                 sp.device_tracked ? "tracked" : "not tracked");
    for (const analyzer::CommProgress& c : p.comms) {
      std::fprintf(out, "  comm %s %-12s rank %d/%d  issued %llu  completed %llu%s\n", daemon::HexId(c.comm).c_str(),
                   c.name.empty() ? "-" : c.name.c_str(), c.comm_rank, c.nranks,
                   static_cast<unsigned long long>(c.issued), static_cast<unsigned long long>(c.completed),
                   !c.completion_known          ? "  (device completion not tracked)"
                   : c.completed < c.issued ? "  <- device work pending"
                                            : "");
    }
    for (const analyzer::IssuedCall& call : p.recent) {
      const char* dtype = daemon::DtypeName(call.sig.dtype);
      std::fprintf(out, "    %s #%-8llu %-14s count %-10llu %-9s peer/root %-4d %s\n", daemon::HexId(call.comm).c_str(),
                   static_cast<unsigned long long>(call.seq), daemon::OpName(call.sig.op),
                   static_cast<unsigned long long>(call.sig.count), dtype != nullptr ? dtype : "-", call.sig.peer,
                   call.completed ? "done" : "pending");
    }
  }
}

int RunDump(const DumpOptions& o) {
  LocalProgressOptions local = o.local;
  local.read.per_comm = o.calls;
  auto ranks = ReadLocalProgress(local);
  if (!ranks.ok()) {
    std::fprintf(stderr, "falcon-ctl dump: %s\n", ranks.status().message().c_str());
    return kExitInput;
  }
  const std::string dir = local.dir.empty() ? daemon::DefaultSegmentDir() : local.dir;
  if (ranks.value().empty()) {
    std::fprintf(stderr, "falcon-ctl dump: no %straced process in %s%s (`falcon-ctl segments` lists what exists)\n",
                 local.include_exited ? "" : "live ", dir.c_str(),
                 local.job.empty() ? "" : (" for job '" + local.job + "'").c_str());
    return kExitInput;
  }
  std::FILE* out = stdout;
  if (!o.output.empty() && o.output != "-") {
    out = std::fopen(o.output.c_str(), "w");
    if (out == nullptr) {
      std::fprintf(stderr, "falcon-ctl dump: cannot write %s\n", o.output.c_str());
      return kExitInput;
    }
  }
  if (o.json) {
    std::vector<analyzer::RankProgress> progress;
    for (const LocalRank& lr : ranks.value()) progress.push_back(lr.progress.progress);
    nlohmann::json doc = daemon::ProgressToJson(progress, "shm");
    for (std::size_t i = 0; i < ranks.value().size(); ++i) {
      const LocalRank& lr = ranks.value()[i];
      nlohmann::json& j = doc["ranks"][i];
      j["pid"] = lr.info.pid;
      j["state"] = daemon::SegmentStateName(lr.info.state);
      j["paused"] = lr.progress.paused;
      j["phase"] = lr.progress.phase;
      j["device_tracked"] = lr.progress.device_tracked;
      const double last = lr.AgeSeconds(lr.progress.last_call_mono_ns);
      j["last_call_age_s"] = last < 0 ? nlohmann::json(nullptr) : nlohmann::json(last);
      const double in_call = lr.AgeSeconds(lr.progress.in_call_since_mono_ns);
      j["in_call_age_s"] = in_call < 0 ? nlohmann::json(nullptr) : nlohmann::json(in_call);
    }
    std::fprintf(out, "%s\n", doc.dump(1).c_str());
  } else {
    PrintTable(ranks.value(), dir, out);
  }
  if (out != stdout && std::fclose(out) != 0) {
    std::fprintf(stderr, "falcon-ctl dump: writing %s failed\n", o.output.c_str());
    return kExitInput;
  }
  return kExitOk;
}

}  // namespace

void AddDumpCommand(CLI::App& app, CommandContext& ctx) {
  auto o = std::make_shared<DumpOptions>();
  CLI::App* cmd = app.add_subcommand(
      "dump", "Every traced process's progress per communicator and its latest calls, read live from this machine's "
              "shim segments (a Flight Recorder without a timeout)");
  cmd->add_option("--dir", o->local.dir, "Segment directory (default $FALCON_SHM_DIR or /dev/shm)");
  cmd->add_option("--job", o->local.job, "Only processes of this job ($FALCON_JOB)");
  cmd->add_flag("--all-users", o->local.all_users, "Include other users' processes (reading needs permission)");
  cmd->add_flag("--exited", o->local.include_exited, "Include exited processes whose segments were kept");
  cmd->add_option("-n,--calls", o->calls, "Latest calls shown per communicator")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{0}, std::size_t{4096}));
  cmd->add_flag("--json", o->json, "The progress document (what `falcon-ctl hang --progress` reads)");
  cmd->add_option("-o,--output", o->output, "Write to this file instead of stdout");
  cmd->callback([o, &ctx] { ctx.exit_code = RunDump(*o); });
}

}  // namespace falcon::ctl
