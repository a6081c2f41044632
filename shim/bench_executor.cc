// Benchmark executor: see bench_executor.h.
#include "shim/bench_executor.h"

#include <dlfcn.h>
#include <nccl.h>
#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "shim/gpu_bench.h"
#include "shim/log.h"
#include "shim/real_nccl.h"
#include "shim/tracer.h"

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

// Optional hook of the NCCL emulator: how much slower this rank's compute is now (>= 1).
double EmulatedComputeFactor(int32_t rank) {
  using FactorFn = double (*)(int, double);
  using SecondsFn = double (*)();
  static auto factor = reinterpret_cast<FactorFn>(dlsym(RTLD_DEFAULT, "falconEmuComputeFactor"));
  static auto seconds = reinterpret_cast<SecondsFn>(dlsym(RTLD_DEFAULT, "falconEmuJobSeconds"));
  if (factor == nullptr || seconds == nullptr || rank < 0) return 1.0;
  const double f = factor(rank, seconds());
  return f >= 1.0 ? f : 1.0;
}

// Optional hook of the NCCL emulator: the modelled GEMM time on this rank's emulated GPU
// (fault plan included), or < 0 when there is no model.
double EmulatedGemmSeconds(int32_t rank, double flops) {
  using GemmFn = double (*)(int, double);
  static auto gemm = reinterpret_cast<GemmFn>(dlsym(RTLD_DEFAULT, "falconEmuGemmSeconds"));
  if (gemm == nullptr || rank < 0) return -1.0;
  return gemm(rank, flops);
}

void SleepNs(int64_t ns) {
  if (ns <= 0) return;
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  nanosleep(&ts, nullptr);
}

// C(m x n) += A(m x k) * B(k x n), row-major, i-k-j order (streams rows of B and C).
void HostGemm(const float* a, const float* b, float* c, uint32_t m, uint32_t n, uint32_t k) {
  for (uint32_t i = 0; i < m; ++i) {
    float* crow = c + uint64_t{i} * n;
    for (uint32_t p = 0; p < k; ++p) {
      const float av = a[uint64_t{i} * k + p];
      const float* brow = b + uint64_t{p} * n;
      for (uint32_t j = 0; j < n; ++j) crow[j] += av * brow[j];
    }
  }
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
  if (t.m == 0 || t.n == 0 || t.k == 0 || t.m > kMaxDim || t.n > kMaxDim || t.k > kMaxDim) {
    r.status = kFalconTaskBadRequest;
    return r;
  }
  if (GpuBenchWanted()) return GpuGemm(t, r, deadline_mono_ns);
  r.timing_source = kFalconTimingHost;
  const double flops = 2.0 * static_cast<double>(t.m) * t.n * t.k;
  double samples[kMaxRepeats];
  // Over the emulator the "GPU" is modelled like its fabric: the GEMM takes the modelled time,
  // so validation measures the emulated device, not how busy the host's cores happen to be.
  if (const double model_s = EmulatedGemmSeconds(tracer.config().rank_hint, flops); model_s >= 0) {
    for (uint32_t rep = 0; rep < t.repeats; ++rep) {
      const int64_t t0 = SystemMonoNs();
      SleepNs(static_cast<int64_t>(model_s * 1e9));
      samples[rep] = Seconds(SystemMonoNs() - t0);
    }
    return Finish(samples, t, flops, r);
  }
  const uint64_t a_n = uint64_t{t.m} * t.k, b_n = uint64_t{t.k} * t.n, c_n = uint64_t{t.m} * t.n;
  auto* buf = static_cast<float*>(std::calloc(a_n + b_n + c_n, sizeof(float)));
  if (buf == nullptr) {
    r.status = kFalconTaskFailed;
    return r;
  }
  for (uint64_t i = 0; i < a_n + b_n; ++i) buf[i] = static_cast<float>(i % 7) * 0.25f;
  HostGemm(buf, buf + a_n, buf + a_n + b_n, t.m, t.n, t.k);  // warm-up
  for (uint32_t rep = 0; rep < t.repeats; ++rep) {
    const int64_t t0 = SystemMonoNs();
    HostGemm(buf, buf + a_n, buf + a_n + b_n, t.m, t.n, t.k);
    const int64_t elapsed = SystemMonoNs() - t0;
    // Over the emulator, a slow-compute fault stretches this rank's compute, GEMM included.
    const double factor = EmulatedComputeFactor(tracer.config().rank_hint);
    SleepNs(static_cast<int64_t>(static_cast<double>(elapsed) * (factor - 1.0)));
    samples[rep] = Seconds(SystemMonoNs() - t0);
  }
  std::free(buf);
  return Finish(samples, t, flops, r);
}

void LogBenchmarkCall(Tracer& tracer, ThreadState& ts, FalconOp op, uint32_t slot, uint64_t bytes, int32_t peer,
                      int64_t t0, int64_t t1, int result) {
  FalconRecord rec;
  std::memset(&rec, 0, sizeof(rec));
  rec.comm_seq = ~uint64_t{0};
  rec.count = bytes;
  rec.t_start_ns = t0;
  rec.t_end_ns = t1;
  rec.comm_slot = slot;
  rec.peer = peer;
  rec.redop = -1;
  rec.op = static_cast<uint8_t>(op);
  rec.dtype = static_cast<uint8_t>(ncclInt8);
  rec.flags = kFalconFlagBenchmark | kFalconFlagHostEnd | kFalconFlagInGroup;
  rec.result = static_cast<uint8_t>(result);
  tracer.Publish(rec, ts.lane_index);
}

struct P2pLog {
  Tracer* tracer;
  ThreadState* ts;
  const FalconTask* task;
};

void LogGpuP2pCall(void* ctx, int64_t t0, int64_t t1, uint64_t bytes, int result) {
  const auto* l = static_cast<const P2pLog*>(ctx);
  const FalconTask& t = *l->task;
  if (t.send_peer >= 0) LogBenchmarkCall(*l->tracer, *l->ts, kFalconOpSend, t.comm_slot, bytes, t.send_peer, t0, t1, result);
  if (t.recv_peer >= 0) LogBenchmarkCall(*l->tracer, *l->ts, kFalconOpRecv, t.comm_slot, bytes, t.recv_peer, t0, t1, result);
}

FalconTaskResult RunP2p(const FalconTask& t, FalconTaskResult r, Tracer& tracer, ThreadState& ts,
                        int64_t deadline_mono_ns) {
  const FalconShmHeader* h = tracer.segment().header();
  if (t.comm_slot >= h->comm_capacity || t.bytes == 0 || t.bytes > kMaxBytes || (t.send_peer < 0 && t.recv_peer < 0)) {
    r.status = kFalconTaskBadRequest;
    return r;
  }
  const FalconCommEntry& entry = tracer.segment().comms()[t.comm_slot];
  const uint32_t state = std::atomic_ref<uint32_t>(const_cast<uint32_t&>(entry.state)).load(std::memory_order_acquire);
  if (state != kFalconCommLive || t.send_peer >= entry.nranks || t.recv_peer >= entry.nranks) {
    r.status = kFalconTaskBadRequest;
    return r;
  }
  auto* comm = reinterpret_cast<ncclComm_t>(static_cast<uintptr_t>(entry.handle));
  if (GpuBenchWanted()) {
    P2pLog log{&tracer, &ts, &t};
    return GpuP2p(t, r, comm, GpuP2pObserver{&LogGpuP2pCall, &log}, deadline_mono_ns);
  }
  if (tracer.gpu().available()) {  // a CUDA process without a current context: host buffers could fault
    Log(LogLevel::kWarn, "benchmark p2p refused: the CUDA driver is loaded but this thread has no current context");
    r.status = kFalconTaskUnsupported;
    return r;
  }
  r.timing_source = kFalconTimingHost;
  auto group_start = RealSymbol<decltype(&pncclGroupStart)>(kFalconOpGroupStart);
  auto group_end = RealSymbol<decltype(&pncclGroupEnd)>(kFalconOpGroupEnd);
  auto send = RealSymbol<decltype(&pncclSend)>(kFalconOpSend);
  auto recv = RealSymbol<decltype(&pncclRecv)>(kFalconOpRecv);
  auto* sendbuf = static_cast<char*>(std::malloc(t.bytes));
  auto* recvbuf = static_cast<char*>(std::malloc(t.bytes));
  if (group_start == nullptr || group_end == nullptr || send == nullptr || recv == nullptr || sendbuf == nullptr ||
      recvbuf == nullptr) {
    std::free(sendbuf);
    std::free(recvbuf);
    r.status = kFalconTaskFailed;
    return r;
  }
  std::memset(sendbuf, 0x5a, t.bytes);
  double samples[kMaxRepeats];
  r.status = kFalconTaskOk;
  for (uint32_t rep = 0; rep <= t.repeats && r.status == kFalconTaskOk; ++rep) {  // rep 0: warm-up
    const int64_t t0 = SystemMonoNs();
    ncclResult_t res = group_start();
    const uint64_t bytes = rep == 0 ? std::min<uint64_t>(t.bytes, FALCON_P2P_WARMUP_BYTES) : t.bytes;
    if (res == ncclSuccess && t.send_peer >= 0) res = send(sendbuf, bytes, ncclInt8, t.send_peer, comm, nullptr);
    if (res == ncclSuccess && t.recv_peer >= 0) res = recv(recvbuf, bytes, ncclInt8, t.recv_peer, comm, nullptr);
    const ncclResult_t end = group_end();
    if (res == ncclSuccess) res = end;
    const int64_t t1 = SystemMonoNs();
    if (t.send_peer >= 0) LogBenchmarkCall(tracer, ts, kFalconOpSend, t.comm_slot, bytes, t.send_peer, t0, t1, res);
    if (t.recv_peer >= 0) LogBenchmarkCall(tracer, ts, kFalconOpRecv, t.comm_slot, bytes, t.recv_peer, t0, t1, res);
    if (res != ncclSuccess) {
      Log(LogLevel::kWarn, "benchmark p2p on comm slot %u failed: NCCL result %d", t.comm_slot, static_cast<int>(res));
      r.status = kFalconTaskFailed;
    } else if (rep > 0) {
      samples[rep - 1] = Seconds(t1 - t0);
    }
  }
  std::free(sendbuf);
  std::free(recvbuf);
  if (r.status != kFalconTaskOk) return r;
  const Timings s = Summarise(samples, t.repeats);
  r.median_s = s.median;
  r.min_s = s.min;
  r.max_s = s.max;
  r.rate = static_cast<double>(t.bytes) / s.median / 1e9;
  return r;
}

}  // namespace

FalconTaskResult RunBenchmarkTask(const FalconTask& task, uint64_t task_seq, Tracer& tracer, ThreadState& ts,
                                  int64_t deadline_mono_ns) {
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
  switch (task.kind) {
    case kFalconTaskGemm: return RunGemm(task, r, tracer, deadline_mono_ns);
    case kFalconTaskP2p: return RunP2p(task, r, tracer, ts, deadline_mono_ns);
    default: r.status = kFalconTaskBadRequest; return r;
  }
}

}  // namespace falcon::shim
