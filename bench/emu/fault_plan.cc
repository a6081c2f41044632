// Fault plan parser and queries; see fault_plan.h for the format.
// Thread-safety: parsing is a pure function; queries are const.
// Must never: let a nlohmann::json exception escape (all parsing runs inside one try block).
#include "fault_plan.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace falcon::emu {
namespace {

using nlohmann::json;

std::optional<FaultKind> KindFromName(const std::string& s) {
  if (s == "compute") return FaultKind::kCompute;
  if (s == "link") return FaultKind::kLink;
  if (s == "nic") return FaultKind::kNic;
  if (s == "hang") return FaultKind::kHang;
  return std::nullopt;
}

// Reads a non-empty array of non-negative integers; returns an error text or "".
std::string ReadIntList(const json& j, const char* key, std::vector<int>* out) {
  if (!j.is_array() || j.empty()) return std::string("\"") + key + "\" must be a non-empty array";
  for (const auto& v : j) {
    if (!v.is_number_integer() || v.get<long long>() < 0 ||
        v.get<long long>() > std::numeric_limits<int>::max()) {
      return std::string("\"") + key + "\" entries must be non-negative integers";
    }
    out->push_back(v.get<int>());
  }
  return "";
}

std::string ReadNumber(const json& f, const char* key, double* out) {
  if (!f.contains(key)) return "";
  const auto& v = f.at(key);
  if (!v.is_number()) return std::string("\"") + key + "\" must be a number";
  *out = v.get<double>();
  if (!std::isfinite(*out)) return std::string("\"") + key + "\" must be finite";
  return "";
}

std::string ParseOne(const json& f, Fault* out) {
  if (!f.is_object()) return "must be an object";
  for (auto it = f.begin(); it != f.end(); ++it) {
    static const std::set<std::string> kKeys = {"kind", "ranks", "nodes", "start_s",
                                                "duration_s", "factor"};
    if (!kKeys.count(it.key())) return "unknown key \"" + it.key() + "\"";
  }
  if (!f.contains("kind") || !f.at("kind").is_string()) return "missing string \"kind\"";
  const auto kind = KindFromName(f.at("kind").get<std::string>());
  if (!kind) {
    return "unknown kind \"" + f.at("kind").get<std::string>() +
           "\" (expected compute, link, nic or hang)";
  }
  out->kind = *kind;
  std::string err;
  if (!(err = ReadNumber(f, "start_s", &out->start_s)).empty()) return err;
  if (!(err = ReadNumber(f, "duration_s", &out->duration_s)).empty()) return err;
  if (out->start_s < 0) return "\"start_s\" must be >= 0";
  if (out->duration_s < 0) return "\"duration_s\" must be >= 0";
  const bool wants_ranks = *kind == FaultKind::kCompute || *kind == FaultKind::kHang;
  const char* need = wants_ranks ? "ranks" : "nodes";
  const char* other = wants_ranks ? "nodes" : "ranks";
  if (f.contains(other)) {
    return std::string("kind \"") + FaultKindName(*kind) + "\" takes \"" + need + "\", not \"" +
           other + "\"";
  }
  if (!f.contains(need)) {
    return std::string("kind \"") + FaultKindName(*kind) + "\" requires \"" + need + "\"";
  }
  if (!(err = ReadIntList(f.at(need), need, wants_ranks ? &out->ranks : &out->nodes)).empty()) {
    return err;
  }
  if (*kind == FaultKind::kLink &&
      (out->nodes.size() != 2 || out->nodes[0] == out->nodes[1])) {
    return "kind \"link\" requires \"nodes\" to be exactly two distinct nodes";
  }
  if (*kind != FaultKind::kHang) {
    if (!f.contains("factor")) return "\"factor\" is required";
    if (!(err = ReadNumber(f, "factor", &out->factor)).empty()) return err;
    if (out->factor < 1) return "\"factor\" must be >= 1";
  }
  return "";
}

}  // namespace

const char* FaultKindName(FaultKind k) {
  switch (k) {
    case FaultKind::kCompute: return "compute";
    case FaultKind::kLink: return "link";
    case FaultKind::kNic: return "nic";
    case FaultKind::kHang: return "hang";
  }
  return "?";
}

double FaultPlan::ComputeFactor(int rank, double t_s) const {
  double f = 1;
  for (const auto& x : faults_) {
    if (x.kind != FaultKind::kCompute || !x.ActiveAt(t_s)) continue;
    for (int r : x.ranks) {
      if (r == rank) {
        f *= x.factor;
        break;
      }
    }
  }
  return f;
}

double FaultPlan::LinkFactor(int a, int b, double t_s) const {
  if (a == b) return 1;
  double f = 1;
  for (const auto& x : faults_) {
    if (!x.ActiveAt(t_s)) continue;
    if (x.kind == FaultKind::kLink) {
      if ((x.nodes[0] == a && x.nodes[1] == b) || (x.nodes[0] == b && x.nodes[1] == a)) {
        f *= x.factor;
      }
    } else if (x.kind == FaultKind::kNic) {
      for (int n : x.nodes) {
        if (n == a || n == b) {
          f *= x.factor;
          break;
        }
      }
    }
  }
  return f;
}

std::optional<double> FaultPlan::HangUntil(int rank, double t_s) const {
  std::optional<double> until;
  for (const auto& x : faults_) {
    if (x.kind != FaultKind::kHang || !x.ActiveAt(t_s)) continue;
    for (int r : x.ranks) {
      if (r != rank) continue;
      const double end = x.duration_s == 0 ? std::numeric_limits<double>::infinity()
                                           : x.start_s + x.duration_s;
      if (!until || end > *until) until = end;
    }
  }
  return until;
}

FaultPlanResult ParseFaultPlan(std::string_view text) {
  FaultPlanResult res;
  try {
    const json doc = json::parse(text);
    if (!doc.is_object()) {
      res.error = "fault plan: top level must be an object with a \"faults\" array";
      return res;
    }
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      if (it.key() != "faults") {
        res.error = "fault plan: unknown top-level key \"" + it.key() + "\"";
        return res;
      }
    }
    if (!doc.contains("faults") || !doc.at("faults").is_array()) {
      res.error = "fault plan: missing \"faults\" array";
      return res;
    }
    std::vector<Fault> faults;
    size_t i = 0;
    for (const auto& f : doc.at("faults")) {
      Fault fault;
      const std::string err = ParseOne(f, &fault);
      if (!err.empty()) {
        res.error = "fault plan: faults[" + std::to_string(i) + "]: " + err;
        return res;
      }
      faults.push_back(std::move(fault));
      ++i;
    }
    res.plan.emplace(std::move(faults));
  } catch (const std::exception& e) {
    res.error = std::string("fault plan: invalid JSON: ") + e.what();
  }
  return res;
}

FaultPlanResult LoadFaultPlan(std::string_view spec) {
  const size_t first = spec.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && spec[first] == '{') return ParseFaultPlan(spec);
  std::ifstream in{std::string(spec)};
  if (!in) {
    FaultPlanResult res;
    res.error = "fault plan: cannot open file \"" + std::string(spec) + "\"";
    return res;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ParseFaultPlan(ss.str());
}

}  // namespace falcon::emu
