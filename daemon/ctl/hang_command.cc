// `falcon-ctl hang`: who or what a stalled job waits for. Loads every rank's progress
// (hang_input.h: a falcon-progress document, or PyTorch Flight Recorder dumps through the
// converter), runs analyzer::DiagnoseHang, and prints the wait-for picture (per communicator:
// each member's calls issued and completed, who is behind, whose work is pending) and every
// finding; `--json` prints one document {schema, findings, comms, missing_ranks, ...} instead.
// Exit: kExitOk nothing found, kExitFound findings, kExitInput bad input, kExitUsage bad flags.
// Single-threaded; reads its input, never writes files.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "analyzer/hang_diagnosis.h"
#include "daemon/common/cli_checks.h"
#include "daemon/ctl/command.h"
#include "daemon/ctl/hang_agents.h"
#include "daemon/ctl/hang_input.h"
#include "daemon/shm/record_json.h"

namespace falcon::ctl {
namespace {

using analyzer::CallSignature;
using analyzer::Finding;
using analyzer::RankProgress;
using nlohmann::json;

constexpr int kSchemaVersion = 1;
constexpr std::uint64_t kNoSeq = ~std::uint64_t{0};
// --live: a job whose latest call is younger than this is still running (a snapshot of a running
// job shows calls in flight and ranks merely ahead as findings).
constexpr double kStillRunningS = 2.0;

struct HangOptions {
  HangSourceOptions source;
  bool agents = false;  // ask every agent of the job (Redis) instead of a local source
  AgentsProgressOptions from_agents;
  bool json = false;
  bool all_comms = false;
  std::size_t max_findings = 64;
};

struct Member {
  std::int64_t rank;
  std::int32_t comm_rank;
  std::uint64_t issued, completed;
  bool known;  // completion tracked: `completed` is exact
};

struct CommRow {
  std::string name;
  std::int32_t nranks = 0;
  std::vector<Member> members;  // ascending rank
  std::uint64_t front = 0;      // the most calls any member issued
  bool Notable() const {
    return std::any_of(members.begin(), members.end(),
                       [&](const Member& m) { return m.issued < front || (m.known && m.completed < m.issued); });
  }
};

std::map<std::uint64_t, CommRow> Comms(const std::vector<RankProgress>& ranks) {
  std::map<std::uint64_t, CommRow> comms;
  for (const RankProgress& r : ranks) {
    for (const analyzer::CommProgress& c : r.comms) {
      CommRow& row = comms[c.comm];
      if (row.name.empty()) row.name = c.name;
      row.nranks = std::max(row.nranks, c.nranks);
      row.members.push_back({r.rank, c.comm_rank, c.issued, c.completed, c.completion_known});
      row.front = std::max(row.front, c.issued);
    }
  }
  for (auto& [id, row] : comms) {
    std::sort(row.members.begin(), row.members.end(), [](const Member& a, const Member& b) { return a.rank < b.rank; });
  }
  return comms;
}

// The signature some rank issued (comm, seq) with, if any rank's recent calls hold it.
const CallSignature* FindCall(const std::vector<RankProgress>& ranks, std::uint64_t comm, std::uint64_t seq) {
  for (const RankProgress& r : ranks) {
    for (const analyzer::IssuedCall& c : r.recent) {
      if (c.comm == comm && c.seq == seq) return &c.sig;
    }
  }
  return nullptr;
}

json SignatureJson(const CallSignature& s) {
  const char* dtype = daemon::DtypeName(s.dtype);
  const char* redop = daemon::RedOpName(s.redop);
  return {{"op", analyzer::CallOpName(s.op)},
          {"dtype", dtype != nullptr ? json(dtype) : json(nullptr)},
          {"redop", redop != nullptr ? json(redop) : json(nullptr)},
          {"peer", s.peer},
          {"count", s.count}};
}

std::string List(const std::vector<std::int64_t>& v) {
  std::string out;
  for (std::int64_t x : v) out += (out.empty() ? "" : ",") + std::to_string(x);
  return out.empty() ? "-" : out;
}

json ResultJson(const HangInput& in, const std::map<std::uint64_t, CommRow>& comms, const std::vector<Finding>& findings) {
  json cj = json::array();
  for (const auto& [id, row] : comms) {
    json members = json::array();
    std::vector<std::int64_t> behind, pending;
    for (const Member& m : row.members) {
      members.push_back({{"rank", m.rank}, {"comm_rank", m.comm_rank}, {"issued", m.issued}, {"completed", m.completed},
                         {"completion_known", m.known}});
      if (m.issued < row.front) behind.push_back(m.rank);
      if (m.known && m.completed < m.issued) pending.push_back(m.rank);
    }
    cj.push_back({{"comm", daemon::HexId(id)}, {"name", row.name}, {"nranks", row.nranks}, {"members", members},
                  {"behind", behind}, {"pending", pending}});
  }
  json fj = json::array();
  std::map<std::string, std::size_t> counts;
  for (const Finding& f : findings) {
    ++counts[analyzer::FindingKindName(f.kind)];
    json chain = json::array();
    for (const analyzer::CallRef& c : f.chain) {
      chain.push_back({{"rank", c.rank}, {"comm", c.seq == kNoSeq ? json(nullptr) : json(daemon::HexId(c.comm))},
                       {"seq", c.seq == kNoSeq ? json(nullptr) : json(c.seq)}});
    }
    json sigs = json::array();
    for (const auto& [rank, sig] : f.signatures) {
      json s = SignatureJson(sig);
      s["rank"] = rank;
      sigs.push_back(s);
    }
    const CallSignature* call = FindCall(in.ranks, f.comm, f.seq);
    auto row = comms.find(f.comm);
    fj.push_back({{"kind", analyzer::FindingKindName(f.kind)},
                  {"comm", daemon::HexId(f.comm)},
                  {"comm_name", row != comms.end() ? json(row->second.name) : json(nullptr)},
                  {"seq", f.seq},
                  {"op", call != nullptr ? json(analyzer::CallOpName(call->op)) : json(nullptr)},
                  {"culprits", f.culprits},
                  {"waiting", f.waiting},
                  {"chain", chain},
                  {"signatures", sigs},
                  {"summary", f.summary}});
  }
  std::vector<std::int64_t> read;
  for (const RankProgress& r : in.ranks) read.push_back(r.rank);
  std::sort(read.begin(), read.end());
  return {{"schema", kSchemaVersion}, {"source", in.source},         {"input", in.origin},
          {"ranks", read},            {"missing_ranks", in.missing_ranks}, {"paused_ranks", in.paused_ranks},
          {"quiet_s", in.quiet_s >= 0 ? json(in.quiet_s) : json(nullptr)}, {"comms", cj},
          {"findings", fj},           {"counts", counts}};
}

void PrintPicture(const std::map<std::uint64_t, CommRow>& comms, bool all) {
  std::size_t shown = 0;
  std::printf("# wait-for picture: calls issued and completed on the device, per member (calls)\n");
  std::printf("%-16s  %-28s  %6s  %10s  %10s  %s\n", "communicator", "name", "rank", "issued", "completed", "state");
  for (const auto& [id, row] : comms) {
    if (!all && !row.Notable()) continue;
    ++shown;
    bool first = true;
    for (const Member& m : row.members) {
      std::string state;
      if (m.issued < row.front) state = "behind by " + std::to_string(row.front - m.issued);
      if (!m.known) state += (state.empty() ? "" : ", ") + std::string("device completion not tracked");
      else if (m.completed < m.issued) state += (state.empty() ? "" : ", ") + std::to_string(m.issued - m.completed) + " pending";
      if (state.empty()) state = "level";
      std::printf("%-16s  %-28.28s  %6lld  %10llu  %10llu  %s\n", first ? daemon::HexId(id).c_str() : "",
                  first ? row.name.c_str() : "", static_cast<long long>(m.rank), static_cast<unsigned long long>(m.issued),
                  static_cast<unsigned long long>(m.completed), state.c_str());
      first = false;
    }
    if (row.nranks > 0 && row.members.size() < static_cast<std::size_t>(row.nranks)) {
      std::printf("%-16s  %-28s  %6s  %10s  %10s  %zu of %d members reported\n", "", "", "-", "-", "-",
                  row.members.size(), row.nranks);
    }
  }
  if (shown < comms.size()) {
    std::printf("# %zu communicator(s) with every member level and nothing pending not shown (--all-comms)\n",
                comms.size() - shown);
  }
}

void PrintFindings(const HangInput& in, const std::map<std::uint64_t, CommRow>& comms, const std::vector<Finding>& findings) {
  std::printf("# findings, most severe first\n");
  std::printf("%3s  %-14s  %-16s  %-20s  %8s  %-13s  %-16s  %s\n", "#", "kind", "communicator", "name", "seq", "op",
              "culprits", "waiting");
  for (std::size_t i = 0; i < findings.size(); ++i) {
    const Finding& f = findings[i];
    const CallSignature* call = FindCall(in.ranks, f.comm, f.seq);
    auto row = comms.find(f.comm);
    std::printf("%3zu  %-14s  %-16s  %-20.20s  %8llu  %-13s  %-16s  %s\n", i + 1, analyzer::FindingKindName(f.kind),
                daemon::HexId(f.comm).c_str(), row != comms.end() ? row->second.name.c_str() : "",
                static_cast<unsigned long long>(f.seq), call != nullptr ? analyzer::CallOpName(call->op).c_str() : "?",
                List(f.culprits).c_str(), List(f.waiting).c_str());
    if (!f.chain.empty()) {
      std::string chain;
      for (const analyzer::CallRef& c : f.chain) {
        chain += (chain.empty() ? "" : " -> ") + std::string("rank ") + std::to_string(c.rank) +
                 (c.seq == kNoSeq ? std::string(" (waits in no call)") : " #" + std::to_string(c.seq) + " on " + daemon::HexId(c.comm));
      }
      std::printf("     chain: %s\n", chain.c_str());
    }
    for (const auto& [rank, sig] : f.signatures) {
      std::printf("     rank %lld: %s\n", static_cast<long long>(rank), SignatureJson(sig).dump().c_str());
    }
    std::printf("     %s\n", f.summary.c_str());
  }
}

int Run(const HangOptions& o) {
  Result<HangInput> loaded = Status::Internal("no source");
  if (o.agents) {
    AgentsProgressOptions a = o.from_agents;
    a.redis.job = o.source.job;
    loaded = LoadAgentsProgress(a);
  } else {
    loaded = LoadHangInput(o.source);
  }
  if (!loaded.ok()) {
    std::fprintf(stderr, "falcon-ctl hang: %s\n", loaded.status().message().c_str());
    switch (loaded.status().code()) {
      case Status::Code::kInvalidArgument: return kExitUsage;
      case Status::Code::kUnavailable: return o.agents ? kExitUnreachable : kExitInput;
      default: return kExitInput;
    }
  }
  const HangInput& in = loaded.value();
  if (in.ranks.empty()) {
    std::fprintf(stderr, "falcon-ctl hang: %s: no rank's progress in it\n", in.origin.c_str());
    return kExitInput;
  }
  analyzer::HangDiagnosisOptions options;
  options.max_findings = o.max_findings;
  const std::vector<Finding> findings = analyzer::DiagnoseHang(in.ranks, options);
  const std::map<std::uint64_t, CommRow> comms = Comms(in.ranks);
  if (o.json) {
    std::printf("%s\n", ResultJson(in, comms, findings).dump().c_str());
    return findings.empty() ? kExitOk : kExitFound;
  }
  std::printf("# falcon-ctl hang 0.1.0 (schema %d)\n", kSchemaVersion);
  std::printf("# input: %s (source %s)\n", in.origin.c_str(), in.source.empty() ? "?" : in.source.c_str());
  std::printf("# ranks: %zu read; missing: %s%s\n", in.ranks.size(), List(in.missing_ranks).c_str(),
              in.missing_ranks.empty() ? "" : " (nothing read from them: a culprit among them cannot be named)");
  std::printf("# max findings: %zu of each kind\n", o.max_findings);
  if (in.quiet_s >= 0) {
    std::printf("# the job's latest NCCL call was %.1f s ago%s\n", in.quiet_s,
                in.quiet_s < kStillRunningS ? ": it is still running, and ranks merely ahead or behind look like "
                                              "findings; diagnose a job that stopped"
                                            : "");
  }
  if (!in.paused_ranks.empty()) {
    std::printf("# paused by Falcon (a validation holds them; not a hang): %s\n", List(in.paused_ranks).c_str());
  }
  PrintPicture(comms, o.all_comms);
  PrintFindings(in, comms, findings);
  std::map<std::string, std::size_t> counts;
  std::vector<std::int64_t> culprits;
  for (const Finding& f : findings) {
    ++counts[analyzer::FindingKindName(f.kind)];
    culprits.insert(culprits.end(), f.culprits.begin(), f.culprits.end());
  }
  std::sort(culprits.begin(), culprits.end());
  culprits.erase(std::unique(culprits.begin(), culprits.end()), culprits.end());
  std::string by_kind;
  for (const auto& [kind, n] : counts) by_kind += (by_kind.empty() ? " (" : ", ") + std::to_string(n) + " " + kind;
  std::printf("# verdict: %zu finding(s)%s%s; culprit rank(s): %s\n", findings.size(), by_kind.c_str(),
              by_kind.empty() ? "" : ")", List(culprits).c_str());
  return findings.empty() ? kExitOk : kExitFound;
}

}  // namespace

void AddHangCommand(CLI::App& app, CommandContext& ctx) {
  auto opts = std::make_shared<HangOptions>();
  CLI::App* cmd = app.add_subcommand(
      "hang",
      "Diagnose a stalled job from every rank's progress: who never issued a call the others wait in, "
      "work that does not complete, mismatched calls, deadlocks (from a falcon-progress document or "
      "PyTorch Flight Recorder dumps, or live from this machine's shim segments)");
  auto* progress = cmd->add_option("--progress", opts->source.progress,
                                   "a falcon-progress document (falcon-ctl dump --json, scripts/falcon-flight-recorder); - for stdin");
  auto* live = cmd->add_flag("--live", opts->source.live,
                             "the processes running on this machine now, read from their shim segments");
  auto* agents = cmd->add_flag("--agents", opts->agents,
                               "the whole job now: ask every falcon-agent of --job for its ranks' progress "
                               "(through Redis)");
  cmd->add_option("--dir", opts->source.dir, "--live: segment directory (default $FALCON_SHM_DIR or /dev/shm)");
  cmd->add_option("--job", opts->source.job,
                  "--live: only processes of this job; --agents: the job (default $FALCON_JOB, else every job "
                  "for --live and \"default\" for --agents)");
  auto* redis = cmd->add_option("--redis", opts->from_agents.redis.url,
                  "--agents: redis://[user[:password]@]host[:port][/db] (default 127.0.0.1:6379; the password "
                  "also from FALCON_REDIS_PASSWORD)");
  auto* agent_timeout = cmd->add_option("--agent-timeout", opts->from_agents.redis.timeout_s,
                                        "--agents: seconds to wait for the agents' answers (and for each Redis command)")
                            ->capture_default_str()->check(daemon::FiniteRange(0.1, 3600));
  auto* calls = cmd->add_option("--calls", opts->from_agents.calls, "--agents: latest calls per communicator each rank reports")
                    ->capture_default_str()->check(daemon::FiniteRange(1, 256));
  for (CLI::Option* o : {redis, agent_timeout, calls}) o->needs(agents);
  auto* fr = cmd->add_option("--flight-recorder", opts->source.flight_recorder,
                             "PyTorch Flight Recorder dumps: a directory of nccl_trace_rank_<rank> files, or the files")
                 ->expected(1, -1);
  progress->excludes(fr);
  live->excludes(progress);
  live->excludes(fr);
  agents->excludes(live);
  agents->excludes(progress);
  agents->excludes(fr);
  cmd->add_option("--flight-recorder-tool", opts->source.tool,
                  "the converter (default: $FALCON_FLIGHT_RECORDER_TOOL, else falcon-flight-recorder in "
                  "<falcon-ctl's dir>/../share/falcon/ or beside falcon-ctl)");
  cmd->add_option("--flight-recorder-prefix", opts->source.prefix,
                  "dump file name prefix before the rank (default nccl_trace_rank_, the basename of "
                  "TORCH_NCCL_DEBUG_INFO_TEMP_FILE)");
  cmd->add_option("--timeout", opts->source.timeout_s, "seconds the converter may take")
      ->capture_default_str()->check(daemon::FiniteRange(1, 86400));
  cmd->add_option("--max-findings", opts->max_findings, "findings reported of each kind")
      ->capture_default_str()->check(daemon::FiniteRange(1, 1000000));
  cmd->add_flag("--all-comms", opts->all_comms, "show every communicator in the picture, not only those with a member behind or work pending");
  cmd->add_flag("--json", opts->json, "print one JSON document instead of the report");
  cmd->callback([opts, &ctx] { ctx.exit_code = Run(*opts); });
}

}  // namespace falcon::ctl
