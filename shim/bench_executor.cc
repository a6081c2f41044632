// Benchmark executor: see bench_executor.h.
#include "shim/bench_executor.h"

#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "shim/gpu_bench.h"
#include "shim/log.h"
#include "shim/real_nccl.h"
#include "shim/tracer.h"
#include "shim/validation_comm.h"

namespace falcon::shim {
namespace {

constexpr uint32_t kMaxRepeats = 1000;
constexpr uint32_t kMaxDim = 8192;
constexpr uint64_t kMaxBytes = uint64_t{1} << 30;

struct Timings {
  double median = 0, min = 0, max = 0;
};

Timings Summarise(double* samples, uint32_t n) {
  std::sort(samples, samples + n);
  return Timings{samples[n / 2], samples[0], samples[n - 1]};
}

double Seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

// C(m x n) += A(m x k) * B(k x n), row-major, i-k-j order (streams rows of B and C). Returns
// false, unfinished, once `deadline_mono_ns` passed (checked every row): a GEMM too large for the
// host must not hold the job past its pause.
bool HostGemm(const float* a, const float* b, float* c, uint32_t m, uint32_t n, uint32_t k, int64_t deadline_mono_ns) {
  for (uint32_t i = 0; i < m; ++i) {
    if (SystemMonoNs() > deadline_mono_ns) return false;
    float* crow = c + uint64_t{i} * n;
    for (uint32_t p = 0; p < k; ++p) {
      const float av = a[uint64_t{i} * k + p];
      const float* brow = b + uint64_t{p} * n;
      for (uint32_t j = 0; j < n; ++j) crow[j] += av * brow[j];
    }
  }
  return true;
}

FalconTaskResult Finish(double* samples, const FalconTask& t, double flops, FalconTaskResult r) {
  const Timings s = Summarise(samples, t.repeats);
  r.median_s = s.median;
  r.min_s = s.min;
  r.max_s = s.max;
  r.rate = s.median > 0 ? flops / s.median / 1e9 : 0.0;
  r.status = kFalconTaskOk;
  return r;
}

FalconTaskResult RunGemm(const FalconTask& t, FalconTaskResult r, Tracer& tracer, int64_t deadline_mono_ns) {
  if (t.m == 0 || t.n == 0 || t.k == 0 || t.m > kMaxDim || t.n > kMaxDim || t.k > kMaxDim ||
      t.dtype > kFalconGemmF16) {
    r.status = kFalconTaskBadRequest;
    return r;
  }
  if (GpuBenchWanted()) {
    void* streams[Tracer::kJobStreams + 1];
    const size_t n = tracer.JobStreams(streams, Tracer::kJobStreams + 1);
    return GpuGemm(t, r, GpuJobStreams{streams, n}, deadline_mono_ns);
  }
  r.timing_source = kFalconTimingHost;
  if (t.dtype != kFalconGemmF32) {  // a host has no bf16 / fp16 GEMM worth comparing
    r.status = kFalconTaskUnsupported;
    return r;
  }
  const double flops = 2.0 * static_cast<double>(t.m) * t.n * t.k;
  double samples[kMaxRepeats];
  const uint64_t a_n = uint64_t{t.m} * t.k, b_n = uint64_t{t.k} * t.n, c_n = uint64_t{t.m} * t.n;
  auto* buf = static_cast<float*>(std::calloc(a_n + b_n + c_n, sizeof(float)));
  if (buf == nullptr) {
    r.status = kFalconTaskFailed;
    return r;
  }
  for (uint64_t i = 0; i < a_n + b_n; ++i) buf[i] = static_cast<float>(i % 7) * 0.25f;
  bool done = HostGemm(buf, buf + a_n, buf + a_n + b_n, t.m, t.n, t.k, deadline_mono_ns);  // warm-up
  for (uint32_t rep = 0; rep < t.repeats && done; ++rep) {
    const int64_t t0 = SystemMonoNs();
    done = HostGemm(buf, buf + a_n, buf + a_n + b_n, t.m, t.n, t.k, deadline_mono_ns);
    samples[rep] = Seconds(SystemMonoNs() - t0);
  }
  std::free(buf);
  if (!done) {
    Log(LogLevel::kWarn, "host GEMM %ux%ux%u did not finish before the pause's deadline; the task failed", t.m, t.n,
        t.k);
    r.status = kFalconTaskFailed;
    return r;
  }
  return Finish(samples, t, flops, r);
}

}  // namespace

FalconTaskResult RunBenchmarkTask(const FalconTask& task, uint64_t task_seq, const TaskBlobs& blobs, Tracer& tracer,
                                  ThreadState& ts, int64_t deadline_mono_ns) {
  FalconTaskResult r;
  std::memset(&r, 0, sizeof(r));
  r.task_seq = task_seq;
  r.kind = task.kind;
  r.timing_source = kFalconTimingHost;
  if (ts.group_depth > 0) {  // never nest validation traffic in the job's open group
    r.status = kFalconTaskFailed;
    return r;
  }
  if (task.repeats == 0 || task.repeats > kMaxRepeats) {
    r.status = kFalconTaskBadRequest;
    return r;
  }
  ValidationComm& vc = tracer.validation();
  switch (task.kind) {
    case kFalconTaskGemm: return RunGemm(task, r, tracer, deadline_mono_ns);
    case kFalconTaskCommId: return vc.MakeId(r, blobs.out);
    case kFalconTaskCommJoin:
      if (tracer.gpu().available() && !GpuBenchWanted()) {
        // A CUDA process whose trapped thread has no current context: host buffers could fault
        // on a GPU communicator.
        Log(LogLevel::kWarn, "validation communicator refused: the CUDA driver is loaded but this thread has no "
                             "current context");
        r.status = kFalconTaskUnsupported;
        return r;
      }
      return vc.Join(task, blobs.in, r, deadline_mono_ns);
    case kFalconTaskP2p:
      if (task.comm_slot != FALCON_VALIDATION_COMM) {
        Log(LogLevel::kWarn, "benchmark p2p refused: transfers run only on the validation communicator, never on "
                             "the job's (comm slot %u)", task.comm_slot);
        r.status = kFalconTaskBadRequest;
        return r;
      }
      return vc.P2p(task, r, tracer, ts, deadline_mono_ns);
    default: r.status = kFalconTaskBadRequest; return r;
  }
}

}  // namespace falcon::shim
