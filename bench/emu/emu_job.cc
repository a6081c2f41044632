// falcon-emu-job: a small multi-rank training-like job over NCCL (run it under falcon-emu-run,
// optionally with the Falcon shim preloaded). World communicator, split into tensor-parallel
// ("TP", consecutive pairs) and data-parallel ("DP") groups; each iteration runs a few
// all-reduces / an all-gather / a reduce-scatter on TP, a grouped send/recv ring on the world, one
// all-reduce on DP and a broadcast, with sleeps standing for compute.
//
//   falcon-emu-job [--iters N] [--compute-ms MS] [--bytes B] [--check] [--stop-file PATH] [--cuda LIB]
//                  [--cuda-after N] [--capture-thread] [--watchdog] [--side-kernel-s S] [--no-world]
//
// --stop-file makes --iters an upper bound: rank 0 looks for PATH every iteration and, once it
// exists, tells every rank through the iteration's broadcast (it sends -(it+1) instead of it) so
// all ranks stop after the same iteration. Tests use it to run a job exactly as long as they need,
// however slow the build (sanitizers) or the machine.
// --check fills buffers with small integers (exact in float) and verifies every result; a wrong
// value exits 1. Prints one summary line per rank.
// --cuda LIB makes the job a CUDA program as far as a preloaded shim can tell: it loads LIB (the
// CUDA driver emulator's libcuda.so.1, or a real driver), makes device rank % 8's primary context
// current and passes a stream of its own to every NCCL call. Host buffers stay host buffers: only
// the emulators accept that.
// --cuda-after N loads the driver only before iteration N, after the job's first NCCL calls (a
// process that starts using CUDA late).
// --capture-thread (with --cuda) runs a second thread that, the whole time, captures its own
// stream into a CUDA graph in the global capture mode, 10 ms at a time, as a framework capturing
// part of its step would; a capture some other thread's calls invalidated is counted, and the
// job then exits 3.
// --no-world issues no collective on the world communicator after start-up, as Megatron-style
// jobs do: the ring runs on the DP group, and the stop word travels by a broadcast on the DP
// group from global rank 0 then one on each TP group from its first rank (DP x TP = the world).
// --side-kernel-s S (with --cuda) gives the job a second stream: its first iteration runs one
// all-reduce there (so a shim knows the stream), its second leaves a modelled kernel of S seconds
// running on it (falconEmuLaunchCompute) that the job never waits for: device work still queued
// when the job is paused.
// --watchdog runs a second thread that polls ncclCommGetAsyncError on every communicator every
// millisecond for the whole run, as PyTorch's ProcessGroupNCCL watchdog does (every 100 ms); an
// error it sees exits 2.
// With --cuda the NCCL calls are asynchronous, as on a GPU: the job synchronises its stream
// (cuStreamSynchronize, in the relaxed capture mode so that --capture-thread's global capture is
// not disturbed) before the host reads or rewrites a buffer a call uses.
// Thread-safety: collectives come from the main thread only; the watchdog only polls errors. Must never: hang without bound (the emulator's deadline fails
// the job) or ignore an NCCL error (any error exits 2).
#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap.h"

namespace {

struct Options {
  int iters = 10;
  double compute_ms = 5;
  size_t bytes = 1 << 20;
  bool check = false;
  std::string stop_file;
  std::string cuda;
  int cuda_after = 0;
  bool capture_thread = false;
  bool watchdog = false;
  bool no_world = false;
  double side_kernel_s = 0;
};

// --cuda: the driver calls a CUDA program makes before NCCL (cuInit, a current primary context,
// a stream). Returns the stream, or exits 2 with the reason.
void* StartCuda(const std::string& lib, int rank) {
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) {
    std::fprintf(stderr, "falcon-emu-job: --cuda %s: %s\n", lib.c_str(), dlerror());
    std::exit(2);
  }
  using InitFn = int (*)(unsigned);
  using DeviceGetFn = int (*)(int*, int);
  using RetainFn = int (*)(void**, int);
  using SetCurrentFn = int (*)(void*);
  using StreamCreateFn = int (*)(void**, unsigned);
  auto init = reinterpret_cast<InitFn>(dlsym(h, "cuInit"));
  auto device_get = reinterpret_cast<DeviceGetFn>(dlsym(h, "cuDeviceGet"));
  auto retain = reinterpret_cast<RetainFn>(dlsym(h, "cuDevicePrimaryCtxRetain"));
  auto set_current = reinterpret_cast<SetCurrentFn>(dlsym(h, "cuCtxSetCurrent"));
  auto stream_create = reinterpret_cast<StreamCreateFn>(dlsym(h, "cuStreamCreate"));
  int device = 0;
  void* ctx = nullptr;
  void* stream = nullptr;
  int rc = -1;
  const char* step = "dlsym";
  if (init && device_get && retain && set_current && stream_create) {
    if ((rc = init(0)) != 0) step = "cuInit";
    else if ((rc = device_get(&device, rank % 8)) != 0) step = "cuDeviceGet";
    else if ((rc = retain(&ctx, device)) != 0) step = "cuDevicePrimaryCtxRetain";
    else if ((rc = set_current(ctx)) != 0) step = "cuCtxSetCurrent";
    else if ((rc = stream_create(&stream, 0)) != 0) step = "cuStreamCreate";
  }
  if (rc != 0) {
    std::fprintf(stderr, "falcon-emu-job: --cuda %s: %s failed (%d)\n", lib.c_str(), step, rc);
    std::exit(2);
  }
  return stream;
}

// --capture-thread: captures a stream of its own in the global mode until *stop; returns the
// number of captures and, in *invalidated, how many of them other threads' calls invalidated.
int CaptureLoop(const std::string& lib, int rank, const std::atomic<bool>* stop, int* invalidated) {
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_NOLOAD);
  using RetainFn = int (*)(void**, int);
  using SetCurrentFn = int (*)(void*);
  using StreamCreateFn = int (*)(void**, unsigned);
  using BeginFn = int (*)(void*, int);
  using EndFn = int (*)(void*, void**);
  auto retain = h ? reinterpret_cast<RetainFn>(dlsym(h, "cuDevicePrimaryCtxRetain")) : nullptr;
  auto set_current = h ? reinterpret_cast<SetCurrentFn>(dlsym(h, "cuCtxSetCurrent")) : nullptr;
  auto stream_create = h ? reinterpret_cast<StreamCreateFn>(dlsym(h, "cuStreamCreate")) : nullptr;
  auto begin = h ? reinterpret_cast<BeginFn>(dlsym(h, "cuStreamBeginCapture_v2")) : nullptr;
  auto end = h ? reinterpret_cast<EndFn>(dlsym(h, "cuStreamEndCapture")) : nullptr;
  void* ctx = nullptr;
  void* stream = nullptr;
  if (!retain || !set_current || !stream_create || !begin || !end || retain(&ctx, rank % 8) != 0 ||
      set_current(ctx) != 0 || stream_create(&stream, 1) != 0) {
    std::fprintf(stderr, "falcon-emu-job: --capture-thread: %s lacks stream capture\n", lib.c_str());
    std::exit(2);
  }
  int captures = 0;
  while (!stop->load(std::memory_order_relaxed)) {
    constexpr int kGlobal = 0;
    if (begin(stream, kGlobal) != 0) {
      std::fprintf(stderr, "falcon-emu-job: cuStreamBeginCapture failed\n");
      std::exit(2);
    }
    timespec ts{0, 10 * 1000 * 1000};
    nanosleep(&ts, nullptr);
    void* graph = nullptr;
    if (end(stream, &graph) != 0) ++*invalidated;
    ++captures;
  }
  return captures;
}

// --cuda: waits for the stream's queued work, as a CUDA program does before the host touches
// the buffers NCCL uses. No-op without a stream (the emulator's calls then complete in place).
void SyncStream(const std::string& lib, void* stream) {
  if (stream == nullptr) return;
  using SyncFn = int (*)(void*);
  using ModeFn = int (*)(int*);
  static void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_NOLOAD);
  static auto sync = h ? reinterpret_cast<SyncFn>(dlsym(h, "cuStreamSynchronize")) : nullptr;
  static auto mode = h ? reinterpret_cast<ModeFn>(dlsym(h, "cuThreadExchangeStreamCaptureMode")) : nullptr;
  int relaxed = 2, rc = -1;
  if (sync != nullptr && mode != nullptr && mode(&relaxed) == 0) {
    rc = sync(stream);
    mode(&relaxed);
  }
  if (rc != 0) {
    std::fprintf(stderr, "falcon-emu-job: cuStreamSynchronize failed (%d)\n", rc);
    std::exit(2);
  }
}

double Now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

#define NCCL_OK(call)                                                                          \
  do {                                                                                         \
    const ncclResult_t rc_ = (call);                                                           \
    if (rc_ != ncclSuccess) {                                                                  \
      std::fprintf(stderr, "falcon-emu-job: %s failed: %s (%s)\n", #call, ncclGetErrorString(rc_), \
                   ncclGetLastError(nullptr));                                                 \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)

void Compute(double ms) {
  if (ms <= 0) return;
  const double s = ms * 1e-3;
  timespec ts{static_cast<time_t>(s), static_cast<long>((s - static_cast<double>(static_cast<time_t>(s))) * 1e9)};
  nanosleep(&ts, nullptr);
}

int Verify(const std::vector<float>& v, size_t n, float expect, const char* what, int* wrong) {
  for (size_t i = 0; i < n; ++i) {
    if (v[i] != expect) {
      std::fprintf(stderr, "falcon-emu-job: %s: element %zu = %g, expected %g\n", what, i,
                   static_cast<double>(v[i]), static_cast<double>(expect));
      ++*wrong;
      return 1;
    }
  }
  return 0;
}

// --side-kernel-s: iteration 0 runs an all-reduce on a second stream (the job's own, kept for
// the process's life); iteration 1 leaves a kernel of o.side_kernel_s seconds running on it.
void SideStreamStep(const Options& o, ncclComm_t comm, int it) {
  static void* side = nullptr;
  void* h = dlopen(o.cuda.c_str(), RTLD_NOW | RTLD_NOLOAD);
  using StreamCreateFn = int (*)(void**, unsigned);
  using LaunchFn = int (*)(void*, double);
  auto stream_create = h ? reinterpret_cast<StreamCreateFn>(dlsym(h, "cuStreamCreate")) : nullptr;
  auto launch = reinterpret_cast<LaunchFn>(dlsym(RTLD_DEFAULT, "falconEmuLaunchCompute"));
  if (stream_create == nullptr || launch == nullptr || (side == nullptr && stream_create(&side, 0) != 0)) {
    std::fprintf(stderr, "falcon-emu-job: --side-kernel-s needs the CUDA driver and NCCL emulators\n");
    std::exit(2);
  }
  if (it == 0) {
    float x = 1;
    NCCL_OK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, static_cast<cudaStream_t>(side)));
    SyncStream(o.cuda, side);
  } else if (launch(side, o.side_kernel_s) != 0) {
    std::fprintf(stderr, "falcon-emu-job: falconEmuLaunchCompute failed\n");
    std::exit(2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) o.iters = std::atoi(argv[++i]);
    else if (a == "--compute-ms" && i + 1 < argc) o.compute_ms = std::atof(argv[++i]);
    else if (a == "--bytes" && i + 1 < argc) o.bytes = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--check") o.check = true;
    else if (a == "--stop-file" && i + 1 < argc) o.stop_file = argv[++i];
    else if (a == "--cuda" && i + 1 < argc) o.cuda = argv[++i];
    else if (a == "--cuda-after" && i + 1 < argc) o.cuda_after = std::atoi(argv[++i]);
    else if (a == "--capture-thread") o.capture_thread = true;
    else if (a == "--watchdog") o.watchdog = true;
    else if (a == "--no-world") o.no_world = true;
    else if (a == "--side-kernel-s" && i + 1 < argc) o.side_kernel_s = std::atof(argv[++i]);
    else if (a == "-h" || a == "--help") {
      std::printf("usage: falcon-emu-job [--iters N] [--compute-ms MS] [--bytes B] [--check] [--stop-file PATH] [--cuda LIB]\n"
                  "                      [--cuda-after N] [--capture-thread] [--watchdog] [--side-kernel-s S] [--no-world]\n");
      return 0;
    } else {
      std::fprintf(stderr, "falcon-emu-job: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const falcon::emu::JobEnv env = falcon::emu::ReadJobEnv();
  const int rank = env.rank, world = env.world_size;
  if ((o.capture_thread || o.side_kernel_s > 0) && (o.cuda.empty() || o.cuda_after > 0)) {
    std::fprintf(stderr, "falcon-emu-job: --capture-thread and --side-kernel-s need --cuda (from the start)\n");
    return 2;
  }
  cudaStream_t stream = nullptr;
  if (!o.cuda.empty() && o.cuda_after <= 0) stream = static_cast<cudaStream_t>(StartCuda(o.cuda, rank));
  std::atomic<bool> capture_stop{false};
  int captures = 0, invalidated = 0;
  std::thread capturer;
  ncclUniqueId id;
  std::string err;
  if (falcon::emu::BootstrapUniqueId(rank, &id, {}, &err) != ncclSuccess) {
    std::fprintf(stderr, "falcon-emu-job: %s\n", err.c_str());
    return 2;
  }
  ncclComm_t comm, tp, dp;
  NCCL_OK(ncclCommInitRank(&comm, world, id, rank));
  const int tp_size = world % 2 == 0 ? 2 : 1;
  NCCL_OK(ncclCommSplit(comm, rank / tp_size, rank, &tp, nullptr));
  NCCL_OK(ncclCommSplit(comm, rank % tp_size, rank, &dp, nullptr));
  std::atomic<bool> watchdog_stop{false};
  std::thread watchdog;
  if (o.watchdog) {
    watchdog = std::thread([&watchdog_stop, comms = std::vector<ncclComm_t>{comm, tp, dp}] {
      while (!watchdog_stop.load(std::memory_order_relaxed)) {
        for (ncclComm_t c : comms) {
          ncclResult_t async = ncclSuccess;
          if (ncclCommGetAsyncError(c, &async) != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
            std::fprintf(stderr, "falcon-emu-job: watchdog: communicator error %d\n", static_cast<int>(async));
            std::exit(2);
          }
        }
        timespec ts{0, 1000 * 1000};
        nanosleep(&ts, nullptr);
      }
    });
  }
  int tp_n = 1, dp_n = 1, tp_rank = 0;
  ncclCommCount(tp, &tp_n);
  ncclCommCount(dp, &dp_n);
  ncclCommUserRank(tp, &tp_rank);
  const size_t count = std::max<size_t>(o.bytes / sizeof(float), static_cast<size_t>(tp_n));
  const size_t shard = count / static_cast<size_t>(tp_n);
  std::vector<float> a(count), g(shard * static_cast<size_t>(tp_n)), s(shard), ring_in(count), ring_out(count);
  int wrong = 0;
  const double t0 = Now();
  int done = 0;
  bool stop = false;
  for (int it = 0; it < o.iters && !stop; ++it) {
    if (!o.cuda.empty() && stream == nullptr && it >= o.cuda_after) {
      stream = static_cast<cudaStream_t>(StartCuda(o.cuda, rank));
    }
    if (o.capture_thread && stream != nullptr && !capturer.joinable()) {
      capturer = std::thread([&] { captures = CaptureLoop(o.cuda, rank, &capture_stop, &invalidated); });
    }
    if (o.side_kernel_s > 0 && it < 2) SideStreamStep(o, comm, it);
    Compute(o.compute_ms);
    for (int k = 0; k < 3; ++k) {
      std::fill(a.begin(), a.end(), static_cast<float>(rank + k));
      NCCL_OK(ncclAllReduce(a.data(), a.data(), count, ncclFloat, ncclSum, tp, stream));
      SyncStream(o.cuda, stream);
      if (o.check) {
        // TP group = consecutive ranks base..base+tp_n-1
        const int base = rank - tp_rank;
        float expect = 0;
        for (int r = 0; r < tp_n; ++r) expect += static_cast<float>(base + r + k);
        Verify(a, count, expect, "tp allreduce", &wrong);
      }
    }
    std::fill(s.begin(), s.end(), static_cast<float>(rank));
    NCCL_OK(ncclAllGather(s.data(), g.data(), shard, ncclFloat, tp, stream));
    NCCL_OK(ncclReduceScatter(g.data(), s.data(), shard, ncclFloat, ncclSum, tp, stream));
    SyncStream(o.cuda, stream);
    if (o.check) {
      // Every member's gathered block tp_rank holds `rank`; the reduce-scatter sums tp_n of them.
      Verify(s, shard, static_cast<float>(tp_n * rank), "tp gather+scatter", &wrong);
    }
    // The ring: over the world, or (--no-world) over the DP group, whose rank d is global rank
    // d * tp_n + tp_rank.
    ncclComm_t ring = o.no_world ? dp : comm;
    const int ring_n = o.no_world ? dp_n : world, ring_me = o.no_world ? rank / tp_n : rank;
    auto global_of = [&](int r) { return o.no_world ? r * tp_n + tp_rank : r; };
    std::fill(ring_in.begin(), ring_in.end(), static_cast<float>(rank * 1000 + it));
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(ring_in.data(), count, ncclFloat, (ring_me + 1) % ring_n, ring, stream));
    NCCL_OK(ncclRecv(ring_out.data(), count, ncclFloat, (ring_me + ring_n - 1) % ring_n, ring, stream));
    NCCL_OK(ncclGroupEnd());
    SyncStream(o.cuda, stream);
    if (o.check) {
      Verify(ring_out, count, static_cast<float>(global_of((ring_me + ring_n - 1) % ring_n) * 1000 + it), "ring", &wrong);
    }
    Compute(o.compute_ms);
    std::fill(a.begin(), a.end(), 1.0f);
    NCCL_OK(ncclAllReduce(a.data(), a.data(), count, ncclFloat, ncclSum, dp, stream));
    SyncStream(o.cuda, stream);
    if (o.check) Verify(a, count, static_cast<float>(dp_n), "dp allreduce", &wrong);
    const bool want_stop = rank == 0 && !o.stop_file.empty() && access(o.stop_file.c_str(), F_OK) == 0;
    const float word = want_stop ? static_cast<float>(-(it + 1)) : static_cast<float>(it);
    std::fill(a.begin(), a.end(), rank == 0 ? word : -1.0f);
    if (o.no_world) {  // global rank 0 -> its DP group -> every TP group
      NCCL_OK(ncclBroadcast(a.data(), a.data(), count, ncclFloat, 0, dp, stream));
      NCCL_OK(ncclBroadcast(a.data(), a.data(), count, ncclFloat, 0, tp, stream));
    } else {
      NCCL_OK(ncclBroadcast(a.data(), a.data(), count, ncclFloat, 0, comm, stream));
    }
    SyncStream(o.cuda, stream);
    stop = a[0] == static_cast<float>(-(it + 1));
    if (o.check) Verify(a, count, stop ? static_cast<float>(-(it + 1)) : static_cast<float>(it), "broadcast", &wrong);
    done = it + 1;
  }
  const double took = Now() - t0;
  capture_stop.store(true);
  if (capturer.joinable()) capturer.join();
  watchdog_stop.store(true);
  if (watchdog.joinable()) watchdog.join();
  if (o.capture_thread) {
    std::printf("falcon-emu-job rank %d: captures=%d invalidated=%d\n", rank, captures, invalidated);
  }
  std::printf("falcon-emu-job rank %d/%d: iters=%d bytes=%zu tp=%d dp=%d time=%.1f ms iter=%.2f ms check=%s\n",
              rank, world, done, count * sizeof(float), tp_n, dp_n, took * 1e3,
              done ? took * 1e3 / done : 0.0, !o.check ? "off" : (wrong ? "WRONG" : "ok"));
  NCCL_OK(ncclCommDestroy(dp));
  NCCL_OK(ncclCommDestroy(tp));
  NCCL_OK(ncclCommDestroy(comm));
  if (wrong) return 1;
  return invalidated > 0 ? 3 : 0;
}
