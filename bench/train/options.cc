// Option table, parser and --help of falcon-train-emu; see options.h. Pure.
#include "options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>

namespace falcon::train {
namespace {

// One row of the option table. `set` parses `value` into the options, returning "" or an error.
struct OptionSpec {
  const char* name;
  const char* arg;  // nullptr: a switch without a value
  const char* help;
  std::function<std::string(Options*, const std::string& value)> set;
};

std::string ParseInt(const std::string& v, long lo, long hi, int* out) {
  errno = 0;
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || errno != 0 || *end != '\0') return "'" + v + "' is not an integer";
  if (x < lo || x > hi) return std::to_string(x) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  *out = static_cast<int>(x);
  return "";
}

std::string ParseDouble(const std::string& v, double lo, double hi, double* out) {
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || errno != 0 || *end != '\0' || !std::isfinite(x)) return "'" + v + "' is not a number";
  if (x < lo || x > hi) return v + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  *out = x;
  return "";
}

// RANK:ITER[:SECONDS] (--inject-stall).
std::string ParseStall(const std::string& v, Options* o) {
  const std::size_t a = v.find(':');
  if (a == std::string::npos) return "expected RANK:ITER[:SECONDS], got '" + v + "'";
  const std::size_t b = v.find(':', a + 1);
  if (std::string e = ParseInt(v.substr(0, a), 0, 1 << 20, &o->stall_rank); !e.empty()) return "RANK: " + e;
  const std::string iter = b == std::string::npos ? v.substr(a + 1) : v.substr(a + 1, b - a - 1);
  if (std::string e = ParseInt(iter, 0, 1 << 30, &o->stall_iter); !e.empty()) return "ITER: " + e;
  if (b == std::string::npos) {
    o->stall_s = -1;
    return "";
  }
  if (std::string e = ParseDouble(v.substr(b + 1), 0, 1e6, &o->stall_s); !e.empty()) return "SECONDS: " + e;
  return "";
}

// Splits `v` at ':' into `parts`.
std::vector<std::string> Fields(const std::string& v) {
  std::vector<std::string> parts;
  std::size_t from = 0;
  for (std::size_t at = v.find(':'); at != std::string::npos; at = v.find(':', from)) {
    parts.push_back(v.substr(from, at - from));
    from = at + 1;
  }
  parts.push_back(v.substr(from));
  return parts;
}

// RANK:ITER:KIND[:GROUP] (--inject-mismatch).
std::string ParseMismatch(const std::string& v, Options* o) {
  const std::vector<std::string> f = Fields(v);
  if (f.size() < 3 || f.size() > 4) return "expected RANK:ITER:KIND[:GROUP], got '" + v + "'";
  if (std::string e = ParseInt(f[0], 0, 1 << 20, &o->mismatch_rank); !e.empty()) return "RANK: " + e;
  if (std::string e = ParseInt(f[1], 0, 1 << 30, &o->mismatch_iter); !e.empty()) return "ITER: " + e;
  if (f[2] == "count") o->mismatch_kind = MismatchKind::kCount;
  else if (f[2] == "dtype") o->mismatch_kind = MismatchKind::kDtype;
  else return "KIND: '" + f[2] + "' is not count or dtype";
  if (f.size() == 3 || f[3] == "tp") o->mismatch_group = InjectGroup::kTp;
  else if (f[3] == "dp") o->mismatch_group = InjectGroup::kDp;
  else return "GROUP: '" + f[3] + "' is not tp or dp";
  return "";
}

// RANK:ITER (--inject-swap).
std::string ParseSwap(const std::string& v, Options* o) {
  const std::vector<std::string> f = Fields(v);
  if (f.size() != 2) return "expected RANK:ITER, got '" + v + "'";
  if (std::string e = ParseInt(f[0], 0, 1 << 20, &o->swap_rank); !e.empty()) return "RANK: " + e;
  if (std::string e = ParseInt(f[1], 0, 1 << 30, &o->swap_iter); !e.empty()) return "ITER: " + e;
  return "";
}

// The injections against the shape (after every flag is read): "" or the error.
std::string CheckInjections(const Options& o) {
  const int world = o.shape.world();
  const std::string job = std::to_string(o.shape.tp) + "x" + std::to_string(o.shape.dp) + "x" +
                          std::to_string(o.shape.pp) + " job of " + std::to_string(world) + " ranks";
  if (o.mismatch_rank >= 0) {
    const bool tp = o.mismatch_group == InjectGroup::kTp;
    const int size = tp ? o.shape.tp : o.shape.dp;
    if (o.world_sync) return "--inject-mismatch needs the Megatron mode; not with --world-sync";
    if (o.mismatch_rank >= world) {
      return "--inject-mismatch: rank " + std::to_string(o.mismatch_rank) + " is not in this " + job;
    }
    if (size < 2) {
      return std::string("--inject-mismatch: the ") + InjectGroupName(o.mismatch_group) + " group has one rank (--" +
             InjectGroupName(o.mismatch_group) + " 1): no peer to disagree with";
    }
  }
  if (o.swap_rank >= 0) {
    if (o.world_sync) return "--inject-swap needs the Megatron mode; not with --world-sync";
    if (o.swap_rank >= world) return "--inject-swap: rank " + std::to_string(o.swap_rank) + " is not in this " + job;
    const int stage = CoordsOf(o.shape, o.swap_rank).pp;
    if (o.shape.pp < 2 || (stage != 0 && stage != o.shape.pp - 1)) {
      return "--inject-swap: rank " + std::to_string(o.swap_rank) + " has no embedding group (it swaps the embd and "
             "mp all-reduces: it must be on the first or last of pp >= 2 stages)";
    }
  }
  return "";
}

std::string ParseSize(const std::string& v, std::size_t hi, std::size_t* out) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || errno != 0 || *end != '\0') return "'" + v + "' is not a byte count";
  if (x > hi) return v + " is larger than " + std::to_string(hi);
  *out = static_cast<std::size_t>(x);
  return "";
}

const std::vector<OptionSpec>& Table() {
  static const std::vector<OptionSpec> kTable = {
      {"--tp", "N", "tensor-parallel size (default 1)",
       [](Options* o, const std::string& v) { return ParseInt(v, 1, 4096, &o->shape.tp); }},
      {"--dp", "N", "data-parallel size (default 1)",
       [](Options* o, const std::string& v) { return ParseInt(v, 1, 4096, &o->shape.dp); }},
      {"--pp", "N", "pipeline-parallel size (default 1); tp*dp*pp must equal the world size",
       [](Options* o, const std::string& v) { return ParseInt(v, 1, 4096, &o->shape.pp); }},
      {"--micro-batches", "M", "micro-batches per DP replica per iteration (default 4)",
       [](Options* o, const std::string& v) { return ParseInt(v, 1, 4096, &o->micro_batches); }},
      {"--layers", "L", "layers per pipeline stage (default 2)",
       [](Options* o, const std::string& v) { return ParseInt(v, 1, 1024, &o->layers); }},
      {"--hidden", "H", "hidden size (default 128)",
       [](Options* o, const std::string& v) { return ParseInt(v, 1, 1 << 16, &o->hidden); }},
      {"--seq", "S", "sequence length (default 64)",
       [](Options* o, const std::string& v) { return ParseInt(v, 1, 1 << 20, &o->seq); }},
      {"--micro-batch-size", "b", "samples per micro-batch (default 2); activations are b*S*H*2 bytes",
       [](Options* o, const std::string& v) { return ParseInt(v, 1, 1 << 16, &o->micro_batch_size); }},
      {"--compute-ms", "MS", "modelled forward time of one layer for one micro-batch (default 2; "
       "backward is 2x), times the fault plan's compute factor",
       [](Options* o, const std::string& v) { return ParseDouble(v, 0, 1e6, &o->compute_ms); }},
      {"--optimizer-ms", "MS", "modelled optimizer step per iteration (default 1)",
       [](Options* o, const std::string& v) { return ParseDouble(v, 0, 1e6, &o->optimizer_ms); }},
      {"--grad-bytes", "B", "DP gradient bytes per rank (default layers*12*H*H/tp*2)",
       [](Options* o, const std::string& v) { return ParseSize(v, std::size_t{1} << 32, &o->grad_bytes); }},
      {"--dp-mode", "MODE", "rs-ag (distributed optimizer: bucketed reduce-scatter + parameter all-gather; the "
       "default) or allreduce (bucketed gradient all-reduce); --world-sync: one all-reduce (default) or one "
       "reduce-scatter + all-gather after the backward",
       [](Options* o, const std::string& v) -> std::string {
         o->dp_mode_given = true;
         if (v == "allreduce") o->dp_mode = DpMode::kAllReduce;
         else if (v == "rs-ag") o->dp_mode = DpMode::kReduceScatterAllGather;
         else return "'" + v + "' is not allreduce or rs-ag";
         return "";
       }},
      {"--iters", "N", "iterations to run (default 10 when --duration-s is not given either)",
       [](Options* o, const std::string& v) { return ParseInt(v, 1, 1 << 30, &o->iters); }},
      {"--duration-s", "S", "stop at the first iteration boundary S seconds after the job epoch",
       [](Options* o, const std::string& v) { return ParseDouble(v, 1e-3, 1e7, &o->duration_s); }},
      {"--check", nullptr, "fill buffers with predictable values and verify every result (exit 1 if wrong)",
       [](Options* o, const std::string&) { o->check = true; return std::string(); }},
      {"--report", "FILE", "write the ground-truth JSON report; \"{rank}\" in FILE becomes the rank "
       "(else \".rank<R>\" is appended when world > 1); \"-\" prints it on stdout",
       [](Options* o, const std::string& v) { o->report = v; return v.empty() ? std::string("empty path") : ""; }},
      {"--progress-every", "N", "rank 0 prints a progress line on stderr every N iterations (default 10; 0 = off)",
       [](Options* o, const std::string& v) { return ParseInt(v, 0, 1 << 30, &o->progress_every); }},
      {"--plan-file", "PATH", "mitigation plan JSON {\"version\": V, \"strategy\": \"S1\"|\"S2\"|\"S3\"|\"S4\"|"
       "\"pipeline\", \"micro_batches\": [m per DP replica], \"placement\": [node per rank], \"exclude_nodes\": "
       "[node..], \"restart\": true, \"warmup\": [warm-up forwards per stage]} (only version + micro_batches: S2), polled by rank 0 at iteration boundaries and "
       "applied by all ranks from the next iteration",
       [](Options* o, const std::string& v) { o->plan_file = v; return v.empty() ? std::string("empty path") : ""; }},
      {"--falcon-plans", nullptr, "take plans from Falcon's C API (falconGetPlan, the LD_PRELOADed shim), polled by "
       "rank 0 at iteration boundaries; without the shim: one warning, no plans. Not with --plan-file",
       [](Options* o, const std::string&) { o->falcon_plans = true; return std::string(); }},
      {"--checkpoint-every", "K", "keep an in-memory checkpoint every K iterations (default 10); an S4 restart rolls "
       "back to the last one",
       [](Options* o, const std::string& v) { return ParseInt(v, 1, 1 << 30, &o->checkpoint_every); }},
      {"--restart-s", "S", "modelled time of an S4 restart: relaunch, communicator set-up and checkpoint load "
       "(default 5)",
       [](Options* o, const std::string& v) { return ParseDouble(v, 0, 1e5, &o->restart_s); }},
      {"--spare-nodes", "N", "idle emulated nodes after the job's own, for S3/S4 placements (default 0)",
       [](Options* o, const std::string& v) { return ParseInt(v, 0, 65535, &o->spare_nodes); }},
      {"--state-bytes", "B", "parameter + optimizer bytes per rank, moved with a rank to its new node (default "
       "8 x gradient bytes)",
       [](Options* o, const std::string& v) { return ParseSize(v, std::size_t{1} << 40, &o->state_bytes); }},
      {"--inject-corruption", "ITER", "test hook for --check: in iteration ITER every rank perturbs one element of "
       "each buffer it sends or contributes, so the receivers' checks must fail (exit 1)",
       [](Options* o, const std::string& v) { return ParseInt(v, 0, 1 << 30, &o->inject_corruption); }},
      {"--inject-stall", "RANK:ITER[:SECONDS]", "fault injection: rank RANK stops issuing NCCL calls before "
       "iteration ITER, as a rank stuck in its data loader, for SECONDS (default: for good; its peers then wait in "
       "their next collective with it)",
       [](Options* o, const std::string& v) { return ParseStall(v, o); }},
      {"--inject-mismatch", "RANK:ITER:KIND[:GROUP]", "fault injection: in iteration ITER rank RANK issues its "
       "first collective on GROUP (tp: the forward's first TP all-reduce, the default; dp: the first DP gradient "
       "bucket) with KIND count (count + 1) or dtype (ncclFloat as ncclFloat16, same count); its peers issue it as "
       "usual. NCCL does not compare calls: the collective never completes (the emulator's lenient mode fails it "
       "at the deadline naming both calls)",
       [](Options* o, const std::string& v) { return ParseMismatch(v, o); }},
      {"--inject-swap", "RANK:ITER", "fault injection: in iteration ITER the embedding-gradient all-reduce (embd) "
       "goes on the grad-norm all-reduce's stream (mp) on every rank, and rank RANK (first or last pipeline stage) "
       "issues the grad norm before the embedding gradients, the opposite order to its peers: a deadlock",
       [](Options* o, const std::string& v) { return ParseSwap(v, o); }},
      {"--world-sync", nullptr, "legacy, kinder mode: the world, tp, dp and pp communicators only, synchronous "
       "NCCL calls, host-side compute, one gradient reduction after the backward and a world all-reduce of the "
       "control word every iteration; no watchdog",
       [](Options* o, const std::string&) { o->world_sync = true; return std::string(); }},
      {"--lazy-init", nullptr, "create each process group's communicator at its first use, by its members "
       "(ncclCommInitRank), instead of splitting the world for every group at start-up",
       [](Options* o, const std::string&) { o->lazy_init = true; return std::string(); }},
      {"--nonblocking", nullptr, "nonblocking communicators (ncclConfig_t.blocking = 0), polled with "
       "ncclCommGetAsyncError until ready",
       [](Options* o, const std::string&) { o->nonblocking = true; return std::string(); }},
      {"--no-watchdog", nullptr, "no watchdog thread (default: one polls ncclCommGetAsyncError on every "
       "communicator every 100 ms and ends the process on an asynchronous error)",
       [](Options* o, const std::string&) { o->watchdog = false; return std::string(); }},
      {"--no-autograd-thread", nullptr, "issue the backward's collectives from the training thread (default: from "
       "an autograd thread of their own while the training thread waits, as PyTorch runs a CUDA backward)",
       [](Options* o, const std::string&) { o->autograd_thread = false; return std::string(); }},
      {"--checkpoint-save-ms", "MS", "modelled time to save each checkpoint (default 0 = nothing modelled); when "
       "> 0 every checkpoint drains the device, sleeps MS and ends in a world barrier",
       [](Options* o, const std::string& v) { return ParseDouble(v, 0, 1e7, &o->checkpoint_save_ms); }},
      {"--pp-comm", "MODE", "pipeline traffic: batched (Megatron's batch_isend_irecv: one group on the PP "
       "communicator per exchange; the default) or per-direction (activations and gradients of every stage pair "
       "on their own 2-rank communicators and streams, receives posted ahead into buffer rings, so a late "
       "gradient never holds up an activation: what pipeline plans need)",
       [](Options* o, const std::string& v) -> std::string {
         if (v == "batched") o->pp_per_direction = false;
         else if (v == "per-direction") o->pp_per_direction = true;
         else return "'" + v + "' is not batched or per-direction";
         return "";
       }},
      {"--activation-limit", "N", "micro-batches' activations a pipeline stage may hold (default pp, what 1F1B "
       "holds on the first stage); a pipeline plan whose warm-up counts need more is rejected",
       [](Options* o, const std::string& v) { return ParseInt(v, 1, 65536, &o->activation_limit); }},
      {"--split-backward", nullptr, "ZeroBubble-style F/B/W: each backward split into B (input gradients, half "
       "its time, sent to the previous stage at once) and W (weight gradients, the other half, no traffic, the "
       "gradient buckets reduced after the last W), in Adaptra's B > F > W order for the warm-up counts in force; "
       "an activation is held until its W. Needs --pp-comm per-direction when pp > 1",
       [](Options* o, const std::string&) { o->split_backward = true; return std::string(); }},
      {"--help", nullptr, "this text",
       [](Options* o, const std::string&) { o->help = true; return std::string(); }},
  };
  return kTable;
}

// Word-wraps `text` to `width` columns, indenting continuation lines by `indent`.
std::string Wrap(const std::string& text, std::size_t indent, std::size_t width) {
  std::string out, word;
  std::size_t col = indent;
  auto flush = [&] {
    if (word.empty()) return;
    if (col > indent && col + 1 + word.size() > width) {
      out += "\n" + std::string(indent, ' ');
      col = indent;
    } else if (col > indent) {
      out += ' ';
      ++col;
    }
    out += word;
    col += word.size();
    word.clear();
  };
  for (char c : text) {
    if (c == ' ') flush();
    else word += c;
  }
  flush();
  return out;
}

}  // namespace

std::size_t Options::ActivationBytes() const {
  return static_cast<std::size_t>(micro_batch_size) * static_cast<std::size_t>(seq) *
         static_cast<std::size_t>(hidden) * 2;
}

std::size_t Options::StateBytes() const { return state_bytes > 0 ? state_bytes : 8 * GradBytes(); }

std::size_t Options::GradBytes() const {
  if (grad_bytes > 0) return grad_bytes;
  const std::size_t h = static_cast<std::size_t>(hidden);
  return static_cast<std::size_t>(layers) * 12 * h * h / static_cast<std::size_t>(shape.tp) * 2;
}

Result<Options> ParseOptions(int argc, const char* const* argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string value;
    bool has_inline = false;
    if (const auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_inline = true;
    }
    if (flag == "-h") flag = "--help";
    const OptionSpec* spec = nullptr;
    for (const OptionSpec& s : Table()) {
      if (flag == s.name) spec = &s;
    }
    if (!spec) return Status::InvalidArgument("unknown option " + flag + " (see --help)");
    if (spec->arg && !has_inline) {
      if (i + 1 >= argc) return Status::InvalidArgument(flag + " needs a value " + spec->arg);
      value = argv[++i];
    } else if (!spec->arg && has_inline) {
      return Status::InvalidArgument(flag + " takes no value");
    }
    if (std::string err = spec->set(&o, value); !err.empty()) {
      return Status::InvalidArgument(flag + ": " + err);
    }
  }
  if (o.iters == 0 && o.duration_s == 0) o.iters = Options::kDefaultIters;
  if (!o.world_sync && !o.dp_mode_given) o.dp_mode = DpMode::kReduceScatterAllGather;  // distributed optimizer
  if (o.world_sync && (o.lazy_init || o.nonblocking)) {
    return Status::InvalidArgument("--lazy-init and --nonblocking model PyTorch's communicators; not with --world-sync");
  }
  if (o.world_sync && o.pp_per_direction) {
    return Status::InvalidArgument("--pp-comm per-direction needs the Megatron mode; not with --world-sync");
  }
  if (o.split_backward && o.world_sync) {
    return Status::InvalidArgument("--split-backward needs the Megatron mode; not with --world-sync");
  }
  if (o.split_backward && o.shape.pp > 1 && !o.pp_per_direction) {
    return Status::InvalidArgument("--split-backward needs --pp-comm per-direction when pp > 1: batched exchanges "
                                   "pair each gradient with 1F1B's next forward");
  }
  if (o.activation_limit > 0 && o.activation_limit < o.shape.pp) {
    return Status::InvalidArgument("--activation-limit " + std::to_string(o.activation_limit) +
                                   " is below pp=" + std::to_string(o.shape.pp) + ": 1F1B itself holds pp");
  }
  if (o.falcon_plans && !o.plan_file.empty()) {
    return Status::InvalidArgument("--plan-file and --falcon-plans are alternatives: choose one plan source");
  }
  if (std::string e = CheckInjections(o); !e.empty()) return Status::InvalidArgument(e);
  return o;
}

std::string UsageText() {
  std::string out =
      "usage: falcon-emu-run -n N [launcher options] -- falcon-train-emu [options]\n"
      "Emulated TP x DP x PP trainer as PyTorch + Megatron-LM run it: 1F1B micro-batches, modelled compute on\n"
      "streams, real NCCL calls, no world collective per iteration (--world-sync: the legacy mode).\n";
  for (const OptionSpec& s : Table()) {
    std::string left = std::string("  ") + s.name + (s.arg ? std::string(" ") + s.arg : "");
    if (left.size() < 24) left.resize(24, ' ');
    else left += "\n" + std::string(24, ' ');
    out += left + Wrap(s.help, 24, 100) + "\n";
  }
  out +=
      "Mitigation plans (--plan-file or --falcon-plans) apply from the iteration after the boundary that agreed\n"
      "on them: S1 back to --micro-batches; S2 micro_batches per DP replica; S3 placement (node of every rank;\n"
      "ranks that change node move --state-bytes over the modelled fabric); S4 restart without exclude_nodes:\n"
      "the excluded nodes' ranks go to spare nodes (or the plan's placement), --restart-s is slept and training\n"
      "rolls back to the last checkpoint; pipeline: warmup = forwards each stage runs before its first backward\n"
      "(non-increasing; 1F1B is pp-s-1), with --pp-comm per-direction and within --activation-limit, no pause.\n"
      "Invalid plans are rejected with a line on rank 0's stderr; every rank\n"
      "acks through falconAckPlan when the shim is loaded. The --report lists every plan with its cost.\n";
  out += "Exit status: 0 ok, 1 a --check verification failed, 2 usage, setup or NCCL error.\n";
  return out;
}

const char* InjectGroupName(InjectGroup group) { return group == InjectGroup::kTp ? "tp" : "dp"; }

const char* DpModeName(DpMode mode) {
  return mode == DpMode::kAllReduce ? "allreduce" : "rs-ag";
}

}  // namespace falcon::train
