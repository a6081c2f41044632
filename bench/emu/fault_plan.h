// Fault plan: the JSON schedule of injected slowdowns shared by the NCCL emulator, the emulated
// trainer and the simulator (DESIGN.md, "Emulator and trainer").
//
//   {"faults": [{"kind": "compute"|"link"|"nic"|"hang", "ranks": [..] | "nodes": [..],
//                "start_s": 30, "duration_s": 60, "factor": 2.5}]}
//
// compute/hang name global "ranks"; link names exactly two distinct "nodes"; nic names one or more
// "nodes". start_s defaults to 0; duration_s absent or 0 means "until the end of the job"; factor
// (>= 1) is required for compute/link/nic and ignored by hang. Unknown keys are errors.
// Times are seconds since the job epoch. A fault is active on [start_s, start_s + duration_s).
//
// Thread-safety: a parsed FaultPlan is immutable; its const queries are safe from any thread.
// Must never: throw (JSON exceptions are caught inside the parser), read the environment or the
// clock (callers pass times in).
#ifndef FALCON_BENCH_EMU_FAULT_PLAN_H_
#define FALCON_BENCH_EMU_FAULT_PLAN_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace falcon::emu {

enum class FaultKind { kCompute, kLink, kNic, kHang };

struct Fault {
  FaultKind kind = FaultKind::kCompute;
  std::vector<int> ranks;   // compute, hang: global ranks
  std::vector<int> nodes;   // link: two distinct nodes; nic: one or more nodes
  double start_s = 0;
  double duration_s = 0;    // 0 = forever
  double factor = 1;

  [[nodiscard]] bool ActiveAt(double t_s) const {
    return t_s >= start_s && (duration_s == 0 || t_s < start_s + duration_s);
  }
};

class FaultPlan {
 public:
  FaultPlan() = default;
  explicit FaultPlan(std::vector<Fault> faults) : faults_(std::move(faults)) {}

  [[nodiscard]] const std::vector<Fault>& faults() const { return faults_; }
  [[nodiscard]] bool empty() const { return faults_.empty(); }

  // Product of the factors of compute faults active for `rank` at `t_s` (1 when none).
  [[nodiscard]] double ComputeFactor(int rank, double t_s) const;
  // Slowdown of traffic between nodes a and b at t_s: product of active link faults on {a, b}
  // and of active nic faults on a or b. 1 for intra-node traffic (a == b).
  [[nodiscard]] double LinkFactor(int node_a, int node_b, double t_s) const;
  // If a hang fault is active for `rank` at t_s: when it ends (seconds since epoch; +inf for
  // forever). nullopt when none is active.
  [[nodiscard]] std::optional<double> HangUntil(int rank, double t_s) const;

 private:
  std::vector<Fault> faults_;
};

// Result of parsing: a plan, or a human-readable error naming the offending fault and field.
struct FaultPlanResult {
  std::optional<FaultPlan> plan;
  std::string error;
  [[nodiscard]] bool ok() const { return plan.has_value(); }
};

// Parses and validates JSON text.
[[nodiscard]] FaultPlanResult ParseFaultPlan(std::string_view json);
// `spec` is inline JSON (first non-blank character '{') or a path to a JSON file.
[[nodiscard]] FaultPlanResult LoadFaultPlan(std::string_view spec);

[[nodiscard]] const char* FaultKindName(FaultKind k);

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_FAULT_PLAN_H_
