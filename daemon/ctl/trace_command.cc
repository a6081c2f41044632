// `falcon-ctl trace` (print a process's call records) and `falcon-ctl segments` (list / reap
// shim segments). Both only read segments, except `segments --reap`, which unlinks segments
// whose owner is gone (segment_dir.h: never one of a live process, in any PID namespace).
// `trace PID` takes a pid as this process sees it: a running process is found in its own PID
// namespace (a container's process may be named by its pid here), an exited one in ours.
// Single-threaded; --follow polls every 100 ms until the process exits or the user presses Ctrl-C.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "daemon/common/cli_checks.h"
#include "daemon/ctl/command.h"
#include "daemon/shm/record_json.h"
#include "daemon/shm/segment_dir.h"
#include "daemon/shm/segment_reader.h"

namespace falcon::ctl {
namespace {

using daemon::SegmentReader;

std::atomic<bool> g_interrupted{false};
void OnSigint(int) { g_interrupted.store(true); }

struct TraceOptions {
  int pid = 0;
  std::string file;
  std::string dir;
  bool json = false;
  bool follow = false;
  std::string from = "oldest";
  uint64_t limit = 0;
};

void PrintPreamble(const SegmentReader& seg, const daemon::CommTable& comms) {
  const FalconShmHeader& h = seg.header();
  std::printf("# falcon-ctl trace 0.1.0 (record schema v%d, shm ABI v%u)\n", daemon::kRecordSchemaVersion,
              h.abi_version);
  std::printf("# segment %s  pid %d  exe %s  host %s  job %s  rank_hint %d  state %s\n", seg.path().c_str(), h.pid,
              h.exe, h.host, h.job[0] ? h.job : "-", h.rank_hint, seg.exited() ? "exited" : "running");
  std::printf("# %u lanes x %llu records, %llu written, lost %llu, dropped %llu; %llu queries counted, not "
              "recorded\n", h.lane_count, static_cast<unsigned long long>(h.lane_capacity),
              static_cast<unsigned long long>(seg.head()), static_cast<unsigned long long>(seg.records_lost()),
              static_cast<unsigned long long>(seg.records_dropped()), static_cast<unsigned long long>(seg.queries()));
  for (const auto& [slot, c] : comms) {
    std::printf("# comm slot %u id %s rank %d/%d device %d parent %s name '%s' %s\n", slot,
                daemon::HexId(c.comm_id).c_str(), c.rank, c.nranks, c.device,
                c.parent_id ? daemon::HexId(c.parent_id).c_str() : "-", c.name,
                c.state == kFalconCommDestroyed ? "destroyed" : "live");
  }
  std::printf("%4s %10s %14s %-20s %-16s %8s %7s %12s %-10s %5s %10s %s\n", "lane", "seq", "t_ms", "op", "comm", "cseq", "rank",
              "count", "dtype", "peer", "dur_us", "result");
}

void PrintRow(const FalconRecord& r, const FalconShmHeader& h, const daemon::CommTable& comms) {
  auto it = comms.find(r.comm_slot);
  const std::string comm = it != comms.end() ? daemon::HexId(it->second.comm_id) : "-";
  char rank[24] = "-";
  if (it != comms.end()) std::snprintf(rank, sizeof(rank), "%d/%d", it->second.rank, it->second.nranks);
  char dur[24] = "-";
  if (r.op == kFalconOpGpuTiming) {
    std::snprintf(dur, sizeof(dur), "%.1fg", static_cast<double>(r.t_end_ns - r.t_start_ns) / 1e3);
  } else if (r.flags & kFalconFlagHostEnd) {
    std::snprintf(dur, sizeof(dur), "%.1f", static_cast<double>(r.t_end_ns - r.t_start_ns) / 1e3);
  }
  const char* dt = daemon::DtypeName(r.dtype);
  char cseq[24] = "-";
  if (r.comm_seq != ~uint64_t{0}) std::snprintf(cseq, sizeof(cseq), "%llu", static_cast<unsigned long long>(r.comm_seq));
  std::printf("%4u %10llu %14.3f %-20s %-16s %8s %7s %12llu %-10s %5d %10s %s\n", r.lane,
              static_cast<unsigned long long>(daemon::RecordIndex(r)),
              static_cast<double>(r.t_start_ns - h.created_mono_ns) / 1e6, daemon::OpName(r.op), comm.c_str(),
              cseq, rank, static_cast<unsigned long long>(r.count), dt ? dt : "-", r.peer, dur,
              daemon::ResultName(r.result));
}

int RunTrace(const TraceOptions& o) {
  std::string path = o.file;
  if (path.empty()) {
    path = daemon::SegmentPathOfPid(o.dir.empty() ? daemon::DefaultSegmentDir() : o.dir,
                                    static_cast<uint32_t>(getuid()), o.pid);
  }
  Result<SegmentReader> opened = SegmentReader::Open(path);
  if (!opened.ok()) {
    std::fprintf(stderr, "falcon-ctl trace: %s\n", opened.status().message().c_str());
    if (opened.status().code() == Status::Code::kNotFound) {
      std::fprintf(stderr, "  (is the process running under LD_PRELOAD=libfalcon_shim.so and has it made an NCCL call?"
                           " `falcon-ctl segments` lists what exists)\n");
    }
    return kExitInput;
  }
  SegmentReader& seg = opened.value();
  daemon::ReadCursor cursor = o.from == "now" ? seg.HeadCursor() : seg.OldestCursor();
  daemon::CommTable comms = daemon::MakeCommTable(seg);
  if (!o.json) PrintPreamble(seg, comms);
  daemon::ReadStats total;
  uint64_t printed = 0;
  signal(SIGINT, OnSigint);
  std::vector<FalconRecord> batch;
  for (;;) {
    const bool owner_gone = daemon::WriterState(seg) != daemon::SegmentInfo::State::kLive;
    const auto mode = (o.follow && !owner_gone) ? SegmentReader::ReadMode::kLive : SegmentReader::ReadMode::kFinal;
    batch.clear();
    daemon::ReadStats s = seg.Read(&cursor, 65536, mode, &batch);
    total.read += s.read;
    total.lost += s.lost;
    total.torn += s.torn;
    if (!batch.empty()) comms = daemon::MakeCommTable(seg);  // new communicators may have appeared
    for (const FalconRecord& r : batch) {
      if (o.limit != 0 && printed >= o.limit) break;
      if (o.json) std::printf("%s\n", daemon::RecordToJson(r, seg.live_header(), comms).dump().c_str());
      else PrintRow(r, seg.header(), comms);
      ++printed;
    }
    std::fflush(stdout);
    const bool done = (o.limit != 0 && printed >= o.limit) || g_interrupted.load();
    if (done || !o.follow || (owner_gone && s.read == 0)) break;
    if (s.read == 0) {
      timespec ts{0, 100 * 1000 * 1000};
      nanosleep(&ts, nullptr);
    }
  }
  if (!o.json) {
    std::printf("# %llu records printed, %llu lost (overwritten before read), %llu torn\n",
                static_cast<unsigned long long>(printed), static_cast<unsigned long long>(total.lost),
                static_cast<unsigned long long>(total.torn));
  }
  return kExitOk;
}

struct SegmentsOptions {
  std::string dir;
  bool json = false;
  bool all_users = false;
  bool reap = false;
};

int RunSegments(const SegmentsOptions& o) {
  const std::string dir = o.dir.empty() ? daemon::DefaultSegmentDir() : o.dir;
  auto listed = daemon::ListSegments(dir, static_cast<uint32_t>(getuid()), o.all_users);
  if (!listed.ok()) {
    std::fprintf(stderr, "falcon-ctl segments: %s\n", listed.status().message().c_str());
    return kExitInput;
  }
  int rc = kExitOk;
  nlohmann::json out = nlohmann::json::array();
  if (!o.json) {
    std::printf("# falcon-ctl segments 0.1.0  dir %s\n", dir.c_str());
    std::printf("%-8s %-12s %-10s %-16s %6s %12s %10s %6s %s\n", "pid", "pidns", "state", "exe", "rank", "records",
                "lost", "comms", o.reap ? "action" : "path");
  }
  for (const daemon::SegmentInfo& s : listed.value()) {
    std::string action;
    if (o.reap && s.state != daemon::SegmentInfo::State::kLive) {
      Status st = daemon::ReapSegment(s);
      action = st.ok() ? "reaped" : "kept: " + st.message();
      if (!st.ok()) rc = kExitFound;
    }
    if (o.json) {
      nlohmann::json j{{"path", s.path},     {"pid", s.pid},           {"uid", s.uid},
                       {"pid_ns", s.pid_ns}, {"own_namespace", s.own_namespace}, {"lock_held", s.lock_held},
                       {"state", daemon::SegmentStateName(s.state)}, {"exe", s.exe},
                       {"job", s.job},       {"host", s.host},         {"rank_hint", s.rank_hint},
                       {"records", s.records}, {"lost", s.lost},       {"comms", s.comms},
                       {"created_real_ns", s.created_real_ns},       {"heartbeat_real_ns", s.heartbeat_real_ns}};
      if (!s.error.empty()) j["error"] = s.error;
      if (!action.empty()) j["action"] = action;
      out.push_back(j);
    } else {
      // pidns "-" is ours: the pid is one this shell can kill or trace.
      const std::string ns = s.own_namespace ? "-" : std::to_string(s.pid_ns);
      std::printf("%-8d %-12s %-10s %-16s %6d %12llu %10llu %6u %s\n", s.pid, ns.c_str(),
                  daemon::SegmentStateName(s.state), s.exe.c_str(), s.rank_hint,
                  static_cast<unsigned long long>(s.records),
                  static_cast<unsigned long long>(s.lost), s.comms, action.empty() ? s.path.c_str() : action.c_str());
    }
  }
  if (o.json) std::printf("%s\n", out.dump(1).c_str());
  else std::printf("# %zu segment(s)\n", listed.value().size());
  return rc;
}

}  // namespace

void AddTraceCommand(CLI::App& app, CommandContext& ctx) {
  auto o = std::make_shared<TraceOptions>();
  CLI::App* cmd = app.add_subcommand("trace", "Print the NCCL calls a process recorded (live or exited)");
  auto* pid = cmd->add_option("pid", o->pid, "Process id of the traced process, as this shell sees it")
                  ->check(CLI::PositiveNumber);
  auto* file = cmd->add_option("--file", o->file, "Read this segment file instead of the one of PID");
  pid->excludes(file);
  cmd->add_option("--dir", o->dir, "Segment directory (default $FALCON_SHM_DIR or /dev/shm)");
  cmd->add_flag("--json", o->json, "One JSON object per record (JSON lines), nothing else on stdout");
  cmd->add_flag("-f,--follow", o->follow, "Keep printing new records until the process exits or Ctrl-C");
  cmd->add_option("--from", o->from, "Start at the oldest record still in the ring, or at now")
      ->check(CLI::IsMember({"oldest", "now"}));
  cmd->add_option("-n,--limit", o->limit, "Stop after this many records (0 = no limit)")->check(daemon::NonNegative());
  cmd->callback([o, &ctx, pid, file] {
    if (pid->count() == 0 && file->count() == 0) {
      std::fprintf(stderr, "falcon-ctl trace: give a PID or --file PATH\n");
      ctx.exit_code = kExitUsage;
      return;
    }
    ctx.exit_code = RunTrace(*o);
  });
}

void AddSegmentsCommand(CLI::App& app, CommandContext& ctx) {
  auto o = std::make_shared<SegmentsOptions>();
  CLI::App* cmd = app.add_subcommand("segments", "List shim segments (live, exited, orphaned) and reap dead ones");
  cmd->add_option("--dir", o->dir, "Segment directory (default $FALCON_SHM_DIR or /dev/shm)");
  cmd->add_flag("--json", o->json, "JSON array output");
  cmd->add_flag("--all-users", o->all_users, "Include other users' segments (reading them needs permission)");
  cmd->add_flag("--reap", o->reap, "Remove segments whose process is gone");
  cmd->callback([o, &ctx] { ctx.exit_code = RunSegments(*o); });
}

}  // namespace falcon::ctl
