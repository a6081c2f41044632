// 1F1B schedule construction; see schedule.h. Pure; no I/O.
#include "schedule.h"

#include <algorithm>
#include <cstdint>

#include "analyzer/pipeline_schedule.h"

namespace falcon::train {
namespace {

// Appends an exchange unless it moves nothing (first/last stage edges).
void AddExchange(std::vector<Step>* steps, const Exchange& x) {
  if (x.empty()) return;
  Step s;
  s.kind = StepKind::kExchange;
  s.xchg = x;
  steps->push_back(s);
}

void AddCompute(std::vector<Step>* steps, StepKind kind, int mb) {
  Step s;
  s.kind = kind;
  s.mb = mb;
  steps->push_back(s);
}

}  // namespace

int WarmupCount(int pp, int stage, int micro_batches) {
  return std::min(pp - stage - 1, micro_batches);
}

std::vector<Step> Build1F1B(int pp, int stage, int micro_batches) {
  return Build1F1BWithWarmup(pp, stage, micro_batches, WarmupCount(pp, stage, micro_batches));
}

std::vector<Step> Build1F1BWithWarmup(int pp, int stage, int micro_batches, int warmup_count) {
  const bool first = stage == 0;
  const bool last = stage == pp - 1;
  const int m = micro_batches;
  const int warmup = std::clamp(warmup_count, 0, m);
  const int steady = m - warmup;
  std::vector<Step> steps;
  int next_fwd = 0;  // next micro-batch to run forward
  int next_bwd = 0;  // next micro-batch to run backward

  // Warm-up: recv_forward; forward; send_forward.
  for (int i = 0; i < warmup; ++i) {
    Exchange in;
    in.recv_fwd_from_prev = !first;
    in.recv_fwd_mb = next_fwd;
    AddExchange(&steps, in);
    AddCompute(&steps, StepKind::kForward, next_fwd);
    Exchange out;
    out.send_fwd_to_next = !last;
    out.send_fwd_mb = next_fwd;
    AddExchange(&steps, out);
    ++next_fwd;
  }
  // Steady state: the first input is received alone; later ones ride on send_backward.
  if (steady > 0) {
    Exchange in;
    in.recv_fwd_from_prev = !first;
    in.recv_fwd_mb = next_fwd;
    AddExchange(&steps, in);
  }
  for (int i = 0; i < steady; ++i) {
    const bool last_steady = i == steady - 1;
    AddCompute(&steps, StepKind::kForward, next_fwd);
    Exchange fwd_out;  // send_forward_recv_backward
    fwd_out.send_fwd_to_next = !last;
    fwd_out.send_fwd_mb = next_fwd;
    fwd_out.recv_bwd_from_next = !last;
    fwd_out.recv_bwd_mb = next_bwd;
    AddExchange(&steps, fwd_out);
    ++next_fwd;
    AddCompute(&steps, StepKind::kBackward, next_bwd);
    Exchange bwd_out;  // send_backward_recv_forward, or send_backward on the last pair
    bwd_out.send_bwd_to_prev = !first;
    bwd_out.send_bwd_mb = next_bwd;
    if (!last_steady) {
      bwd_out.recv_fwd_from_prev = !first;
      bwd_out.recv_fwd_mb = next_fwd;
    }
    AddExchange(&steps, bwd_out);
    ++next_bwd;
  }
  // Cool-down: recv_backward; backward; send_backward.
  for (int i = 0; i < warmup; ++i) {
    Exchange in;
    in.recv_bwd_from_next = !last;
    in.recv_bwd_mb = next_bwd;
    AddExchange(&steps, in);
    AddCompute(&steps, StepKind::kBackward, next_bwd);
    Exchange out;
    out.send_bwd_to_prev = !first;
    out.send_bwd_mb = next_bwd;
    AddExchange(&steps, out);
    ++next_bwd;
  }
  return steps;
}

Result<std::vector<Step>> BuildSplitBackward(int pp, int stage, int micro_batches, const std::vector<int>& warmup,
                                             double forward_ms, double input_grad_ms, double weight_grad_ms) {
  if (pp < 1 || stage < 0 || stage >= pp || micro_batches < 1) {
    return Status::InvalidArgument("split-backward schedule: stage " + std::to_string(stage) + " of " +
                                   std::to_string(pp) + " with " + std::to_string(micro_batches) + " micro-batches");
  }
  if (warmup.size() != static_cast<std::size_t>(pp)) {
    return Status::InvalidArgument("split-backward schedule: " + std::to_string(warmup.size()) +
                                   " warm-up counts for " + std::to_string(pp) + " stages");
  }
  analyzer::PipelineModel model;
  model.backward = analyzer::BackwardMode::kSplit;
  // Milliseconds in, seconds in the model: only the ratios matter for the order.
  model.stages.assign(static_cast<std::size_t>(pp),
                      analyzer::StageTimes{forward_ms / 1e3, input_grad_ms / 1e3, weight_grad_ms / 1e3});
  model.link_delay_s.assign(static_cast<std::size_t>(pp - 1), 0.0);
  // Megatron counts the forwards before the first 1F1B pair; the planner counts the forwards
  // before the first backward, one more.
  std::vector<std::int32_t> x;
  x.reserve(warmup.size());
  for (int w : warmup) x.push_back(std::clamp(w, 0, micro_batches - 1) + 1);
  Result<analyzer::PipelineSchedule> sched = analyzer::BuildPipelineSchedule(model, x, micro_batches);
  if (!sched.ok()) return Status::InvalidArgument("split-backward schedule: " + sched.status().message());
  std::vector<Step> steps;
  const auto& ops = sched.value().stages[static_cast<std::size_t>(stage)];
  steps.reserve(ops.size());
  for (const analyzer::PipelineOp& op : ops) {
    const StepKind kind = op.kind == analyzer::PipelineOpKind::kForward    ? StepKind::kForward
                          : op.kind == analyzer::PipelineOpKind::kBackward ? StepKind::kBackward
                                                                           : StepKind::kWeight;
    AddCompute(&steps, kind, op.microbatch);
  }
  return steps;
}

std::string ToString(const std::vector<Step>& steps) {
  std::string out;
  for (const Step& s : steps) {
    if (!out.empty()) out += ' ';
    switch (s.kind) {
      case StepKind::kForward: out += "F" + std::to_string(s.mb); break;
      case StepKind::kBackward: out += "B" + std::to_string(s.mb); break;
      case StepKind::kWeight: out += "W" + std::to_string(s.mb); break;
      case StepKind::kExchange: {
        const Exchange& x = s.xchg;
        out += "x[";
        if (x.recv_fwd_from_prev) out += "rf" + std::to_string(x.recv_fwd_mb);
        if (x.send_fwd_to_next) out += "sf" + std::to_string(x.send_fwd_mb);
        if (x.recv_bwd_from_next) out += "rb" + std::to_string(x.recv_bwd_mb);
        if (x.send_bwd_to_prev) out += "sb" + std::to_string(x.send_bwd_mb);
        out += "]";
        break;
      }
    }
  }
  return out;
}

}  // namespace falcon::train
