// SimJob: see sim_job.h.
#include "bench/sim/sim_job.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

namespace falcon::sim {
namespace {

using json = nlohmann::json;

constexpr std::uint64_t kTpTag = 1, kDpTag = 2, kPpTag = 3;

std::uint64_t CommId(std::uint64_t tag, std::uint64_t index, std::uint64_t seed) {
  return Mix((tag << 56) ^ index ^ Mix(seed));
}

// A standard normal draw from two uniform hashes (Box-Muller).
double Normal(std::uint64_t key) {
  const double u1 = (static_cast<double>(Mix(key) >> 11) + 0.5) / 9007199254740992.0;
  const double u2 = (static_cast<double>(Mix(key ^ 0x9e3779b97f4a7c15ULL) >> 11) + 0.5) / 9007199254740992.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

Result<std::vector<std::int64_t>> IntList(const json& f, const char* name) {
  std::vector<std::int64_t> out;
  if (!f.contains(name)) return out;
  if (!f[name].is_array()) return Status::InvalidArgument(std::string(name) + " must be an array of integers");
  for (const json& v : f[name]) {
    if (!v.is_number_integer()) return Status::InvalidArgument(std::string(name) + " must be an array of integers");
    out.push_back(v.get<std::int64_t>());
  }
  return out;
}

}  // namespace

std::uint64_t Mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

Result<std::vector<SimFault>> ParseFaultPlan(const std::string& text, const SimShape& shape) {
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("faults") || !doc["faults"].is_array()) {
    return Status::InvalidArgument("fault plan: expected a JSON object with an array \"faults\"");
  }
  std::vector<SimFault> out;
  for (std::size_t i = 0; i < doc["faults"].size(); ++i) {
    const json& f = doc["faults"][i];
    const std::string where = "fault plan: faults[" + std::to_string(i) + "]: ";
    if (!f.is_object() || !f.contains("kind") || !f["kind"].is_string()) {
      return Status::InvalidArgument(where + "needs a string \"kind\"");
    }
    SimFault x;
    x.kind = f["kind"].get<std::string>();
    if (x.kind == "hang") return Status::InvalidArgument(where + "kind \"hang\" is not modelled by falcon-sim yet");
    if (x.kind != "compute" && x.kind != "link" && x.kind != "nic") {
      return Status::InvalidArgument(where + "kind must be compute, link or nic, not \"" + x.kind + "\"");
    }
    for (const char* name : {"start_s", "duration_s", "factor"}) {
      if (f.contains(name) && !f[name].is_number()) return Status::InvalidArgument(where + name + " must be a number");
    }
    x.start_s = f.value("start_s", 0.0);
    x.duration_s = f.value("duration_s", 0.0);
    x.factor = f.value("factor", 2.0);
    if (x.start_s < 0 || x.duration_s < 0 || !(x.factor >= 1.0 && x.factor <= 1000.0)) {
      return Status::InvalidArgument(where + "start_s and duration_s must be >= 0 and factor in [1, 1000]");
    }
    Result<std::vector<std::int64_t>> ranks = IntList(f, "ranks");
    Result<std::vector<std::int64_t>> nodes = IntList(f, "nodes");
    if (!ranks.ok()) return Status::InvalidArgument(where + ranks.status().message());
    if (!nodes.ok()) return Status::InvalidArgument(where + nodes.status().message());
    x.ranks = ranks.value();
    x.nodes = nodes.value();
    for (std::int64_t r : x.ranks) {
      if (r < 0 || r >= shape.ranks()) return Status::InvalidArgument(where + "rank " + std::to_string(r) + " is not in the job");
    }
    for (std::int64_t n : x.nodes) {
      if (n < 0 || n >= shape.nodes()) return Status::InvalidArgument(where + "node " + std::to_string(n) + " is not in the job");
    }
    if (x.kind == "compute" && x.ranks.empty()) return Status::InvalidArgument(where + "compute needs \"ranks\"");
    if (x.kind == "link" && (x.nodes.size() != 2 || x.nodes[0] == x.nodes[1])) {
      return Status::InvalidArgument(where + "link needs \"nodes\": two different nodes");
    }
    if (x.kind == "nic" && x.nodes.size() != 1) return Status::InvalidArgument(where + "nic needs \"nodes\": one node");
    out.push_back(std::move(x));
  }
  return out;
}

SimJob::SimJob(SimShape shape, std::vector<SimFault> faults, std::int64_t start_ns)
    : shape_(shape), faults_(std::move(faults)), start_ns_(start_ns) {}

std::vector<SimComm> SimJob::Comms(std::int64_t r) const {
  const int t = TpIndex(r), d = DpIndex(r), s = Stage(r);
  const std::uint64_t m = static_cast<std::uint64_t>(shape_.micro_batches);
  std::vector<SimComm> out;
  if (shape_.tp > 1) {
    out.push_back({CommId(kTpTag, static_cast<std::uint64_t>(s) * shape_.dp + d, shape_.seed), t, shape_.tp, "tp", -1,
                   -1, 4 * m});
  }
  if (shape_.dp > 1) {
    out.push_back({CommId(kDpTag, static_cast<std::uint64_t>(s) * shape_.tp + t, shape_.seed), d, shape_.dp, "dp", -1,
                   -1, 2});
  }
  const std::int64_t stride = std::int64_t{shape_.tp} * shape_.dp;
  // The pair (s, s+1) of pipeline column (d, t): index = column * pp + s.
  const std::uint64_t column = static_cast<std::uint64_t>(d) * shape_.tp + t;
  if (s > 0) {
    out.push_back({CommId(kPpTag, column * shape_.pp + (s - 1), shape_.seed), 1, 2, "pp", r - stride, -1, 2 * m});
  }
  if (s + 1 < shape_.pp) {
    out.push_back({CommId(kPpTag, column * shape_.pp + s, shape_.seed), 0, 2, "pp", -1, r + stride, 2 * m});
  }
  return out;
}

std::uint64_t SimJob::Period(std::int64_t r) const {
  std::uint64_t n = 0;
  for (const SimComm& c : Comms(r)) n += c.calls_per_iteration;
  return n;
}

analyzer::RankCallPattern SimJob::Pattern(std::int64_t r, std::uint64_t iterations_done) const {
  analyzer::RankCallPattern p;
  p.rank = r;
  const std::vector<SimComm> comms = Comms(r);
  std::optional<std::uint32_t> tp, dp, prev, next;
  for (std::uint32_t i = 0; i < comms.size(); ++i) {
    p.comms.push_back({comms[i].id, comms[i].nranks, comms[i].calls_per_iteration * iterations_done, -1, {}});
    if (comms[i].kind == "tp") tp = i;
    if (comms[i].kind == "dp") dp = i;
    if (comms[i].kind == "pp" && comms[i].peer_prev >= 0) prev = i;
    if (comms[i].kind == "pp" && comms[i].peer_next >= 0) next = i;
  }
  auto single = [&](std::uint32_t c) { p.units.push_back({false, {{c, 1}}}); };
  auto pair_group = [&](std::optional<std::uint32_t> a, std::optional<std::uint32_t> b) {
    analyzer::CallUnit u{true, {}};
    if (a) u.calls.push_back({*a, 1});
    if (b) u.calls.push_back({*b, 1});
    if (!u.calls.empty()) p.units.push_back(std::move(u));
  };
  for (int phase = 0; phase < 2; ++phase) {  // forward, then backward
    for (int mb = 0; mb < shape_.micro_batches; ++mb) {
      if (tp) {
        single(*tp);
        single(*tp);
      }
      // Forward: recv from the previous stage, send to the next; backward the other way.
      pair_group(phase == 0 ? prev : next, phase == 0 ? next : prev);
    }
  }
  if (dp) {
    single(*dp);
    single(*dp);
  }
  p.iteration_at_start = iterations_done;
  return p;
}

bool SimJob::Active(const SimFault& f, std::int64_t t_ns) const {
  const double t = static_cast<double>(t_ns - start_ns_) / 1e9;
  return t >= f.start_s && (f.duration_s <= 0 || t < f.start_s + f.duration_s);
}

bool SimJob::LinkCarriesTraffic(std::int64_t node_a, std::int64_t node_b) const {
  const std::int64_t n = shape_.ranks();
  for (std::int64_t r = node_a * shape_.gpus_per_node; r < std::min(n, (node_a + 1) * shape_.gpus_per_node); ++r) {
    const std::int64_t stride = std::int64_t{shape_.tp} * shape_.dp;
    for (std::int64_t peer : {r - stride, r + stride}) {  // pipeline neighbours
      if (peer >= 0 && peer < n && Node(peer) == node_b) return true;
    }
    const std::int64_t base = r - std::int64_t{DpIndex(r)} * shape_.tp;  // DP member 0
    for (int d = 0; d < shape_.dp; ++d) {
      if (Node(base + std::int64_t{d} * shape_.tp) == node_b) return true;
    }
  }
  return false;
}

double SimJob::Slowdown(std::int64_t t_ns) const {
  double slow = 1.0;
  for (const SimFault& f : faults_) {
    if (!Active(f, t_ns)) continue;
    double s = 1.0;
    if (f.kind == "compute") s = 1.0 + (f.factor - 1.0) * shape_.compute_share;
    if (f.kind == "nic") s = 1.0 + (f.factor - 1.0) * shape_.comm_share;
    if (f.kind == "link" && LinkCarriesTraffic(f.nodes[0], f.nodes[1])) s = 1.0 + (f.factor - 1.0) * shape_.comm_share;
    slow = std::max(slow, s);  // the slowest straggler sets the pace of a synchronous job
  }
  return slow;
}

SimJob::Iteration SimJob::IterationAt(std::uint64_t k) {
  while (iterations_.size() <= k) {
    const std::uint64_t i = iterations_.size();
    std::int64_t start = UnheldStart(i);  // iteration i - 1 is cached: no recursion
    if (auto h = holds_.find(i); h != holds_.end()) start = std::max(start, h->second);
    const double noise = std::max(0.5, 1.0 + shape_.noise * Normal(Mix(shape_.seed) ^ i));
    iterations_.push_back({start, shape_.iteration_s * noise * Slowdown(start)});
  }
  return iterations_[k];
}

std::uint64_t SimJob::IterationsBefore(std::int64_t t_ns) {
  std::uint64_t k = iterations_.empty() ? 0 : iterations_.size() - 1;
  while (k > 0 && IterationAt(k).start_ns >= t_ns) --k;
  while (IterationAt(k).start_ns < t_ns) ++k;
  return k;
}

void SimJob::Hold(std::uint64_t k, std::int64_t until_ns) {
  holds_[k] = until_ns;
  // Iteration k and every one after it are computed again from the new boundary.
  if (iterations_.size() > k) iterations_.resize(k);
}

std::int64_t SimJob::UnheldStart(std::uint64_t k) {
  if (k == 0) return start_ns_;
  const Iteration prev = IterationAt(k - 1);
  return prev.start_ns + static_cast<std::int64_t>(prev.seconds * 1e9);
}

std::int64_t SimJob::Skew(std::int64_t r) const {
  return static_cast<std::int64_t>(Mix(static_cast<std::uint64_t>(r) ^ shape_.seed) % 4'000'000);
}

}  // namespace falcon::sim
