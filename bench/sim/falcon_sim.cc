// falcon-sim: a simulated job of up to 32,768 ranks whose agents speak the real protocol to a real
// Redis and the real falcon-controller (docs/benchmarks.md, "Falcon at scale").
//
// main() wires: flags, the fault plan, then K worker processes (fork), each playing the agents
// of a contiguous range of nodes (SimAgents) on one Redis connection, ticking every --tick-ms
// until --duration-s or SIGTERM/SIGINT. Each worker writes its counters to a pipe; the parent
// sums them into --summary. Stderr gets `falcon-sim: ready ...` once every rank has registered
// and `falcon-sim: fault ...` when each fault of the plan starts (wall ns), for the harness.
// Must never: leave a worker behind (they die with the parent: PR_SET_PDEATHSIG).
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/sim/sim_agents.h"
#include "daemon/protocol/keys.h"

namespace {

using json = nlohmann::json;
using falcon::sim::AgentCadence;
using falcon::sim::DeviceModel;
using falcon::sim::SimShape;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

std::int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

struct Options {
  std::string redis_host = "127.0.0.1";
  int redis_port = 6379;
  std::string job = "sim";
  SimShape shape;
  AgentCadence cadence;
  DeviceModel device;
  double duration_s = 0;  // 0: until a signal
  std::string fault_plan;
  int processes = 1;
  int tick_ms = 50;
  std::string summary;
};

json ByType(const std::map<std::string, falcon::sim::LatencySample>& lags) {
  json out = json::object();
  for (const auto& [type, v] : lags) out[type] = falcon::sim::LatencySummary(v);
  return out;
}

json CountersJson(const falcon::sim::SimCounters& c, const falcon::sim::LatencySample& tick_ms, double cpu_s) {
  return {{"messages", c.messages}, {"commands", c.commands}, {"acks", c.acks}, {"late_traps", c.late_traps},
          {"redis_commands", c.redis_commands}, {"redis_errors", c.redis_errors}, {"cpu_s", cpu_s},
          {"tick_ms", falcon::sim::LatencySummary(tick_ms)},
          {"command_read_lag_ms", ByType(c.command_read_lag_ms)}, {"ack_lag_ms", ByType(c.ack_lag_ms)}};
}

// One worker: nodes [first, end). Writes its counters as one JSON line to fd `out` at exit.
int RunWorker(const Options& o, std::vector<falcon::sim::SimFault> faults, std::int64_t start_ns, std::int64_t first,
              std::int64_t end, int worker, int out, int ready_fd) {
  falcon::redis::RedisOptions ro;
  ro.host = o.redis_host;
  ro.port = o.redis_port;
  ro.command_timeout_ms = 10000;
  auto conn = std::make_unique<falcon::redis::RedisConnection>(ro);
  falcon::sim::SimAgents agents(falcon::sim::SimJob(o.shape, std::move(faults), start_ns), o.job, first, end, worker,
                                o.cadence, o.device, std::move(conn));
  const std::int64_t stop_ns = o.duration_s > 0 ? start_ns + static_cast<std::int64_t>(o.duration_s * 1e9) : 0;
  bool told_ready = false;
  std::string last_error;
  falcon::sim::LatencySample tick_ms;  // how long each tick took (its sleep excluded)
  while (!g_stop && (stop_ns == 0 || WallNs() < stop_ns)) {
    const auto tick_start = std::chrono::steady_clock::now();
    if (!agents.conn().connected()) {
      if (falcon::Status s = agents.conn().Connect(); !s.ok()) {
        if (s.message() != last_error) std::fprintf(stderr, "falcon-sim: worker %d: %s\n", worker, s.message().c_str());
        last_error = s.message();
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        continue;
      }
    }
    const falcon::Status ticked = agents.Tick(WallNs());
    tick_ms.Add(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - tick_start).count());
    if (falcon::Status s = ticked; !s.ok()) {
      if (s.message() != last_error) std::fprintf(stderr, "falcon-sim: worker %d: %s\n", worker, s.message().c_str());
      last_error = s.message();
      agents.conn().Close();
    }
    if (agents.registered() && !told_ready) {
      told_ready = true;
      const char one = 1;
      (void)!write(ready_fd, &one, 1);
    }
    std::this_thread::sleep_until(tick_start + std::chrono::milliseconds(o.tick_ms));
  }
  const std::string line = CountersJson(agents.counters(), tick_ms, CpuSeconds()).dump() + "\n";
  (void)!write(out, line.data(), line.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"falcon-sim: the agents of a simulated job of thousands of ranks, over real Redis, for the real "
               "falcon-controller"};
  app.add_option("--redis-host", o.redis_host, "Redis host")->capture_default_str();
  app.add_option("--redis-port", o.redis_port, "Redis port")->check(CLI::Range(1, 65535))->capture_default_str();
  app.add_option("--job", o.job, "job name (falcon:{job}:...)")->capture_default_str();
  app.add_option("--tp", o.shape.tp, "tensor-parallel size")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--pp", o.shape.pp, "pipeline stages")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--dp", o.shape.dp, "data-parallel size")->check(CLI::Range(1, 32768))->capture_default_str();
  app.add_option("--gpus-per-node", o.shape.gpus_per_node, "ranks per node (agent)")
      ->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--micro-batches", o.shape.micro_batches, "micro-batches per iteration")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--iteration-s", o.shape.iteration_s, "healthy iteration time, s")
      ->check(CLI::Range(0.01, 600.0))->capture_default_str();
  app.add_option("--noise", o.shape.noise, "relative sd of an iteration's time")
      ->check(CLI::Range(0.0, 0.5))->capture_default_str();
  app.add_option("--duration-s", o.duration_s, "run this long (0: until SIGTERM/SIGINT)")
      ->check(CLI::Range(0.0, 1e6))->capture_default_str();
  app.add_option("--fault-plan", o.fault_plan, "fault plan JSON file (DESIGN.md; start_s from the sim's start)");
  app.add_option("--processes", o.processes, "worker processes (each plays a share of the nodes)")
      ->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--tick-ms", o.tick_ms, "worker tick")->check(CLI::Range(5, 1000))->capture_default_str();
  app.add_option("--heartbeat-ms", o.cadence.heartbeat_ms, "agent heartbeat (rank keys)")
      ->check(CLI::Range(100, 60000))->capture_default_str();
  app.add_option("--flush-ms", o.cadence.flush_ms, "iteration batches per rank every")
      ->check(CLI::Range(50, 60000))->capture_default_str();
  app.add_option("--signature-ms", o.cadence.signature_ms, "call_signatures per rank every (0: none)")
      ->check(CLI::Range(0, 60000))->capture_default_str();
  app.add_option("--signature-full-seqs", o.cadence.signature_full_seqs,
                 "calls per communicator sent as runs; later ones as block digests (agent signature_full_seqs)")
      ->check(CLI::Range(std::uint64_t{0}, std::uint64_t{9'200'000'000'000'000'000ULL}))->capture_default_str();
  bool no_broadcast = false;
  app.add_flag("--no-broadcast", no_broadcast,
               "play agents that read only their own command stream (no broadcast), as agents before it");
  app.add_option("--profile-ms", o.cadence.profile_ms, "profile window")
      ->check(CLI::Range(100, 600000))->capture_default_str();
  app.add_option("--seed", o.shape.seed, "noise and id seed")->capture_default_str();
  app.add_option("--summary", o.summary, "write the run's counters here as JSON at exit");
  CLI11_PARSE(app, argc, argv);
  o.cadence.broadcast = !no_broadcast;

  if (!falcon::protocol::ValidKeyPart(o.job)) {
    std::fprintf(stderr, "falcon-sim: --job must be 1..128 characters of [A-Za-z0-9._-]\n");
    return 2;
  }
  if (o.shape.ranks() > 32768) {
    std::fprintf(stderr, "falcon-sim: tp x pp x dp = %lld ranks; at most 32768\n",
                 static_cast<long long>(o.shape.ranks()));
    return 2;
  }
  std::vector<falcon::sim::SimFault> faults;
  if (!o.fault_plan.empty()) {
    std::ifstream in(o.fault_plan);
    if (!in) {
      std::fprintf(stderr, "falcon-sim: cannot read --fault-plan %s\n", o.fault_plan.c_str());
      return 2;
    }
    std::stringstream text;
    text << in.rdbuf();
    falcon::Result<std::vector<falcon::sim::SimFault>> f = falcon::sim::ParseFaultPlan(text.str(), o.shape);
    if (!f.ok()) {
      std::fprintf(stderr, "falcon-sim: %s: %s\n", o.fault_plan.c_str(), f.status().message().c_str());
      return 2;
    }
    faults = f.value();
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::signal(SIGPIPE, SIG_IGN);

  const std::int64_t nodes = o.shape.nodes();
  const int k = static_cast<int>(std::min<std::int64_t>(o.processes, nodes));
  const std::int64_t start_ns = WallNs();
  int counters_pipe[2], ready_pipe[2];
  if (pipe(counters_pipe) != 0 || pipe(ready_pipe) != 0) {
    std::perror("falcon-sim: pipe");
    return 1;
  }
  std::vector<pid_t> children;
  for (int w = 0; w < k; ++w) {
    const std::int64_t first = nodes * w / k, end = nodes * (w + 1) / k;
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("falcon-sim: fork");
      g_stop = true;
      break;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      close(counters_pipe[0]);
      close(ready_pipe[0]);
      std::_Exit(RunWorker(o, faults, start_ns, first, end, w, counters_pipe[1], ready_pipe[1]));
    }
    children.push_back(pid);
  }
  close(counters_pipe[1]);
  close(ready_pipe[1]);
  std::fprintf(stderr, "falcon-sim: started ranks=%lld nodes=%lld shape=%dx%dx%d (tp x pp x dp) processes=%d\n",
               static_cast<long long>(o.shape.ranks()), static_cast<long long>(nodes), o.shape.tp, o.shape.pp,
               o.shape.dp, k);
  // Ready once every worker has registered its ranks; faults are announced as they start.
  std::thread ready([&] {
    int seen = 0;
    char c;
    while (seen < k && read(ready_pipe[0], &c, 1) == 1) ++seen;
    if (seen == k) {
      std::fprintf(stderr, "falcon-sim: ready ranks=%lld nodes=%lld\n", static_cast<long long>(o.shape.ranks()),
                   static_cast<long long>(nodes));
    }
  });
  std::vector<bool> announced(faults.size(), false);
  const std::int64_t stop_ns = o.duration_s > 0 ? start_ns + static_cast<std::int64_t>(o.duration_s * 1e9) : 0;
  while (!g_stop && (stop_ns == 0 || WallNs() < stop_ns)) {
    for (std::size_t i = 0; i < faults.size(); ++i) {
      const std::int64_t at = start_ns + static_cast<std::int64_t>(faults[i].start_s * 1e9);
      if (announced[i] || WallNs() < at) continue;
      announced[i] = true;
      json who = faults[i].kind == "compute" ? json(faults[i].ranks) : json(faults[i].nodes);
      std::fprintf(stderr, "falcon-sim: fault kind=%s %s=%s factor=%.3g at_ns=%lld\n", faults[i].kind.c_str(),
                   faults[i].kind == "compute" ? "ranks" : "nodes", who.dump().c_str(), faults[i].factor,
                   static_cast<long long>(at));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t pid : children) kill(pid, SIGTERM);
  json total = {{"ranks", o.shape.ranks()}, {"nodes", nodes}, {"processes", k},
                {"shape", {{"tp", o.shape.tp}, {"pp", o.shape.pp}, {"dp", o.shape.dp}}},
                {"messages", json::object()}, {"commands", json::object()}, {"acks", 0}, {"late_traps", 0}, {"redis_commands", 0},
                {"redis_errors", 0}, {"cpu_s", 0.0}, {"latency", json::array()}};
  std::string buffer;
  char chunk[4096];
  for (ssize_t n; (n = read(counters_pipe[0], chunk, sizeof chunk)) > 0;) buffer.append(chunk, static_cast<std::size_t>(n));
  for (pid_t pid : children) waitpid(pid, nullptr, 0);
  ready.join();  // its read ends at the latest when the last worker exits (EOF)
  close(ready_pipe[0]);
  std::istringstream lines(buffer);
  for (std::string line; std::getline(lines, line);) {
    const json w = json::parse(line, nullptr, false);
    if (!w.is_object()) continue;
    for (const char* map : {"messages", "commands"}) {
      for (const auto& [type, n] : w[map].items()) total[map][type] = total[map].value(type, 0) + n.get<std::uint64_t>();
    }
    for (const char* n : {"acks", "late_traps", "redis_commands", "redis_errors"}) total[n] = total[n].get<std::uint64_t>() + w[n].get<std::uint64_t>();
    total["cpu_s"] = total["cpu_s"].get<double>() + w["cpu_s"].get<double>();
    // Percentiles do not add up: one entry per worker, each its own.
    total["latency"].push_back({{"tick_ms", w["tick_ms"]}, {"command_read_lag_ms", w["command_read_lag_ms"]},
                                {"ack_lag_ms", w["ack_lag_ms"]}});
  }
  total["wall_s"] = static_cast<double>(WallNs() - start_ns) / 1e9;
  if (!o.summary.empty()) {
    std::ofstream out(o.summary);
    out << total.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "falcon-sim: cannot write --summary %s\n", o.summary.c_str());
      return 1;
    }
  }
  return 0;
}
