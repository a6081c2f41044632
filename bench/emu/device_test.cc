// The emulated device is asynchronous, as a GPU: over the CUDA driver emulator (cuda_emu.cc,
// loaded as a CUDA program loads libcuda.so.1) an NCCL call returns once its work is queued on
// its stream; events complete when their stream reaches them and carry device time; streams run
// in order, wait for events, and the legacy stream synchronises with blocking streams; compute
// kernels (falconEmuLaunchCompute, cuBLAS GEMMs) are slowed by compute faults, with noise; an
// abort or a peer's exit ends a device wait; mismatched calls are enqueued but never complete; a
// captured graph replays its kernels. Every rank is a forked process (the driver's worker
// threads never exist in the gtest process itself).
//
// Thread-safety: the gtest process only forks; inside a rank the main thread drives, plus one
// thread for a call that must block. Must never: sleep to synchronise: a wait that must NOT end
// waits with a deadline and expects the deadline.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "emu_test_util.h"
#include "falcon_emu.h"

namespace falcon::emu {
namespace {

using testing::AllZero;
using testing::Codes;
using testing::MonoNow;
using testing::RunOptions;
using testing::RunRanks;

constexpr int kNotReady = 600;

// The driver (and cuBLAS) emulator's entry points, loaded as a CUDA program loads them.
struct Cu {
  int (*init)(unsigned);
  int (*retain)(void**, int);
  int (*set_current)(void*);
  int (*stream_create)(void**, unsigned);
  int (*stream_sync)(void*);
  int (*stream_wait_event)(void*, void*, unsigned);
  int (*event_create)(void**, unsigned);
  int (*event_record)(void*, void*);
  int (*event_query)(void*);
  int (*event_sync)(void*);
  int (*elapsed)(float*, void*, void*);
  int (*memset_async)(unsigned long long, unsigned, size_t, void*);
  int (*begin_capture)(void*, int);
  int (*end_capture)(void*, void**);
  int (*instantiate)(void**, void*, unsigned long long);
  int (*graph_launch)(void*, void*);
  int (*cublas_create)(void**);
  int (*cublas_set_stream)(void*, void*);
  int (*sgemm)(void*, int, int, int, int, int, const float*, const float*, int, const float*, int, const float*, float*,
               int);

  // Loads both libraries, makes device `device`'s primary context current; exits 3 on failure.
  static Cu Load(int device) {
    void* cuda = dlopen(FALCON_CUDA_EMU_PATH, RTLD_NOW | RTLD_GLOBAL);
    void* blas = dlopen(FALCON_CUBLAS_EMU_PATH, RTLD_NOW | RTLD_LOCAL);
    if (cuda == nullptr || blas == nullptr) {
      std::fprintf(stderr, "cannot load the emulators: %s\n", dlerror());
      _exit(3);
    }
    Cu c{};
    bool ok = true;
    auto get = [&](void* lib, const char* name, auto* fn) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib, name));
      ok = ok && *fn != nullptr;
    };
    get(cuda, "cuInit", &c.init);
    get(cuda, "cuDevicePrimaryCtxRetain", &c.retain);
    get(cuda, "cuCtxSetCurrent", &c.set_current);
    get(cuda, "cuStreamCreate", &c.stream_create);
    get(cuda, "cuStreamSynchronize", &c.stream_sync);
    get(cuda, "cuStreamWaitEvent", &c.stream_wait_event);
    get(cuda, "cuEventCreate", &c.event_create);
    get(cuda, "cuEventRecord", &c.event_record);
    get(cuda, "cuEventQuery", &c.event_query);
    get(cuda, "cuEventSynchronize", &c.event_sync);
    get(cuda, "cuEventElapsedTime_v2", &c.elapsed);
    get(cuda, "cuMemsetD32Async", &c.memset_async);
    get(cuda, "cuStreamBeginCapture_v2", &c.begin_capture);
    get(cuda, "cuStreamEndCapture", &c.end_capture);
    get(cuda, "cuGraphInstantiateWithFlags", &c.instantiate);
    get(cuda, "cuGraphLaunch", &c.graph_launch);
    get(blas, "cublasCreate_v2", &c.cublas_create);
    get(blas, "cublasSetStream_v2", &c.cublas_set_stream);
    get(blas, "cublasSgemm_v2", &c.sgemm);
    void* ctx = nullptr;
    if (!ok || c.init(0) != 0 || c.retain(&ctx, device) != 0 || c.set_current(ctx) != 0) {
      std::fprintf(stderr, "the driver emulator is incomplete\n");
      _exit(3);
    }
    return c;
  }
  void* Stream(unsigned flags = 0) const {
    void* s = nullptr;
    return stream_create(&s, flags) == 0 ? s : nullptr;
  }
  void* Event() const {
    void* e = nullptr;
    return event_create(&e, 0) == 0 ? e : nullptr;
  }
  void* RecordOn(void* stream) const {
    void* e = Event();
    return e != nullptr && event_record(e, stream) == 0 ? e : nullptr;
  }
  // Seconds between two completed events (device time); -1 on error.
  double Seconds(void* a, void* b) const {
    float ms = 0;
    return elapsed(&ms, a, b) == 0 ? static_cast<double>(ms) / 1e3 : -1.0;
  }
};

// True if `e` completes within `seconds` (polled; cuEventQuery never blocks).
bool CompletesWithin(const Cu& cu, void* e, double seconds) {
  const double deadline = MonoNow() + seconds;
  for (;;) {
    if (cu.event_query(e) == 0) return true;
    if (MonoNow() > deadline) return false;
    usleep(1000);
  }
}

// A one-way go signal between ranks (a pipe created before the fork).
struct Signal {
  int fds[2] = {-1, -1};
  Signal() { (void)!pipe(fds); }
  void Give() const { (void)!write(fds[1], "x", 1); }
  void Await() const {
    char c;
    (void)!read(fds[0], &c, 1);
  }
};

// A two-rank barrier: neither rank passes Meet until both arrived. A test that checks "still
// waiting" and then aborts meets first, or the faster rank's abort (which the emulator reports
// to the peer's outstanding device work as a gone rank, failing it) lands inside the slower
// rank's check.
struct Meeting {
  Signal arrived[2];
  void Meet(int rank) const {
    arrived[rank].Give();
    arrived[1 - rank].Await();
  }
};

RunOptions Quiet(double deadline_s = 60) {
  RunOptions opt;
  opt.deadline_s = deadline_s;
  opt.env["FALCON_EMU_COMPUTE_NOISE"] = "0";
  return opt;
}

TEST(DeviceTest, CollectiveReturnsBeforeItsPeerArrivesAndCompletesInStreamOrder) {
  Signal go;
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    const Cu cu = Cu::Load(rank);
    auto* s = static_cast<cudaStream_t>(cu.Stream());
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    if (rank == 1) go.Await();  // rank 1 calls only once rank 0 saw its calls return
    std::vector<float> v(1024, static_cast<float>(rank + 1));
    const double t0 = MonoNow();
    EMU_CHECK(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, comm, s) == ncclSuccess, "first");
    EMU_CHECK(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, comm, s) == ncclSuccess, "second");
    void* done = cu.RecordOn(s);
    if (rank == 0) {
      EMU_CHECK(MonoNow() - t0 < 1.0, "the calls took %.3f s to return: they waited for rank 1", MonoNow() - t0);
      EMU_CHECK(cu.event_query(done) == kNotReady, "the work completed without rank 1");
      EMU_CHECK(!CompletesWithin(cu, done, 0.3), "the work completed without rank 1");
      go.Give();
    }
    EMU_CHECK(cu.event_sync(done) == 0, "sync");
    // In stream order: the second all-reduce sums the first one's results (3 + 3).
    EMU_CHECK(v[0] == 6.0f && v[1023] == 6.0f, "v = %g, %g", static_cast<double>(v[0]), static_cast<double>(v[1023]));
    ncclResult_t async = ncclInProgress;
    EMU_CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclSuccess, "async %d", async);
    EMU_CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
    return failures;
  }, Quiet());
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

// The send buffer is read when the device runs the send, not at the call: a program that
// rewrites it before synchronising sends what the device found, as on a GPU. (A kernel queued
// first keeps the device busy while the host rewrites the buffer.)
TEST(DeviceTest, SendReadsItsBufferWhenTheDeviceRunsIt) {
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    const Cu cu = Cu::Load(rank);
    auto* s = static_cast<cudaStream_t>(cu.Stream());
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    std::vector<int> buf(256, 1);
    auto exchange = [&] {
      ncclGroupStart();
      if (rank == 0) ncclSend(buf.data(), buf.size(), ncclInt32, 1, comm, s);
      else ncclRecv(buf.data(), buf.size(), ncclInt32, 0, comm, s);
      return ncclGroupEnd();
    };
    EMU_CHECK(exchange() == ncclSuccess, "connect");  // the first exchange connects the pair
    EMU_CHECK(cu.stream_sync(s) == 0, "sync");
    if (rank == 0) EMU_CHECK(falconEmuLaunchCompute(s, 1.0) == 0, "kernel");
    EMU_CHECK(exchange() == ncclSuccess, "exchange");
    if (rank == 0) std::fill(buf.begin(), buf.end(), 2);  // while the kernel still runs
    EMU_CHECK(cu.stream_sync(s) == 0, "sync");
    if (rank == 1) EMU_CHECK(buf[0] == 2 && buf[255] == 2, "received %d: the send read its buffer at the call", buf[0]);
    EMU_CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
    return failures;
  }, Quiet());
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

// NCCL connects a pair at its first send/recv inside ncclGroupEnd, blocking until the peer
// arrives; later exchanges only enqueue.
TEST(DeviceTest, FirstSendBlocksGroupEndUntilThePeerConnects) {
  Signal go;
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    const Cu cu = Cu::Load(rank);
    auto* s = static_cast<cudaStream_t>(cu.Stream());
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    std::vector<int> buf(64, rank);
    auto exchange = [&] {
      ncclGroupStart();
      if (rank == 0) ncclSend(buf.data(), buf.size(), ncclInt32, 1, comm, s);
      else ncclRecv(buf.data(), buf.size(), ncclInt32, 0, comm, s);
      return ncclGroupEnd();
    };
    if (rank == 1) {
      go.Await();
      EMU_CHECK(exchange() == ncclSuccess, "recv");
    } else {
      std::atomic<bool> returned{false};
      std::thread t([&] {
        const Cu mine = Cu::Load(rank);  // the thread's own current context, as a CUDA program sets
        (void)mine;
        EMU_CHECK(exchange() == ncclSuccess, "send");
        returned.store(true);
      });
      const double deadline = MonoNow() + 0.5;
      while (MonoNow() < deadline && !returned.load()) usleep(1000);
      EMU_CHECK(!returned.load(), "the first send returned before its peer connected");
      go.Give();
      t.join();
      const double t0 = MonoNow();
      EMU_CHECK(exchange() == ncclSuccess, "second send");  // connected: returns without the peer
      EMU_CHECK(MonoNow() - t0 < 1.0, "the second send waited %.3f s", MonoNow() - t0);
    }
    if (rank == 1) EMU_CHECK(exchange() == ncclSuccess, "second recv");
    EMU_CHECK(cu.stream_sync(s) == 0, "sync");
    if (rank == 1) EMU_CHECK(buf[0] == 0, "received %d", buf[0]);
    EMU_CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
    return failures;
  }, Quiet());
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

TEST(DeviceTest, EventsTimeTheDeviceAndStreamsOrderAndWait) {
  const auto codes = RunRanks(1, [&](int, const ncclUniqueId&) {
    int failures = 0;
    const Cu cu = Cu::Load(0);
    void* a = cu.Stream(1);  // non-blocking streams
    void* b = cu.Stream(1);
    void* c = cu.Stream(1);
    const double t0 = MonoNow();
    void* a0 = cu.RecordOn(a);
    EMU_CHECK(falconEmuLaunchCompute(a, 0.3) == 0, "launch");
    EMU_CHECK(falconEmuLaunchCompute(a, 0.2) == 0, "launch");
    void* a1 = cu.RecordOn(a);
    EMU_CHECK(MonoNow() - t0 < 0.2, "launching took %.3f s: kernels ran on the host", MonoNow() - t0);
    EMU_CHECK(cu.event_query(a1) == kNotReady, "the kernels finished at once");
    // b waits for a's kernels; c does not.
    EMU_CHECK(cu.stream_wait_event(b, a1, 0) == 0, "wait event");
    void* b1 = cu.RecordOn(b);
    void* c1 = cu.RecordOn(c);
    EMU_CHECK(CompletesWithin(cu, c1, 0.2), "an independent stream waited for another stream's kernels");
    EMU_CHECK(cu.event_query(b1) == kNotReady, "the wait on an event was ignored");
    const double host_wait = MonoNow();
    EMU_CHECK(cu.event_sync(b1) == 0, "sync");
    const double device = cu.Seconds(a0, a1);
    EMU_CHECK(device >= 0.49 && device < 0.7, "two kernels of 0.3 + 0.2 s took %.3f s of device time", device);
    EMU_CHECK(cu.Seconds(a1, b1) >= 0, "b reached its event after a's");
    // Device time, not host time: a's end was reached long before the host asked.
    usleep(100000);
    void* late = cu.RecordOn(a);
    EMU_CHECK(cu.event_sync(late) == 0, "sync");
    EMU_CHECK(cu.Seconds(a0, late) > device + 0.09, "an idle stream's later event carries the later time");
    (void)host_wait;
    return failures;
  }, Quiet());
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

TEST(DeviceTest, LegacyStreamSynchronisesWithBlockingStreamsOnly) {
  const auto codes = RunRanks(1, [&](int, const ncclUniqueId&) {
    int failures = 0;
    const Cu cu = Cu::Load(0);
    void* blocking = cu.Stream(0);
    void* nonblocking = cu.Stream(1);
    EMU_CHECK(falconEmuLaunchCompute(blocking, 0.3) == 0, "launch");
    void* legacy = cu.RecordOn(nullptr);  // waits for the blocking stream's kernel
    void* nb = cu.RecordOn(nonblocking);
    EMU_CHECK(CompletesWithin(cu, nb, 0.2), "a non-blocking stream waited for a blocking one");
    EMU_CHECK(cu.event_query(legacy) == kNotReady, "the legacy stream did not wait for the blocking stream");
    EMU_CHECK(cu.event_sync(legacy) == 0, "sync");
    // And a blocking stream waits for earlier legacy work.
    EMU_CHECK(falconEmuLaunchCompute(nullptr, 0.3) == 0, "launch");
    void* after = cu.RecordOn(blocking);
    void* nb2 = cu.RecordOn(nonblocking);
    EMU_CHECK(CompletesWithin(cu, nb2, 0.2), "a non-blocking stream waited for the legacy stream");
    EMU_CHECK(cu.event_query(after) == kNotReady, "a blocking stream did not wait for the legacy stream");
    EMU_CHECK(cu.stream_sync(nullptr) == 0 && cu.event_sync(after) == 0, "sync");
    return failures;
  }, Quiet());
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

// Median of the device times of `n` kernels launched by `launch` on `s`; all samples in *out.
template <class F>
double MedianKernel(const Cu& cu, void* s, int n, F launch, std::vector<double>* out) {
  std::vector<void*> ev{cu.RecordOn(s)};
  for (int i = 0; i < n; ++i) {
    launch();
    ev.push_back(cu.RecordOn(s));
  }
  cu.stream_sync(s);
  out->clear();
  for (int i = 0; i < n; ++i) out->push_back(cu.Seconds(ev[static_cast<size_t>(i)], ev[static_cast<size_t>(i) + 1]));
  std::vector<double> sorted = *out;
  std::sort(sorted.begin(), sorted.end());
  return sorted[sorted.size() / 2];
}

// A compute fault on rank 0's GPU slows every kernel there, the job's and cuBLAS's GEMMs alike,
// with a few per cent of noise; rank 1 runs at the nominal speed.
TEST(DeviceTest, ComputeFaultSlowsKernelsAndGemmsWithNoise) {
  RunOptions opt = Quiet(90);
  opt.env["FALCON_EMU_COMPUTE_NOISE"] = "0.05";
  opt.env["FALCON_EMU_FAULT_PLAN"] = R"({"faults": [{"kind": "compute", "ranks": [0], "factor": 3}]})";
  opt.env["FALCON_EMU_EPOCH_NS"] = "1";
  // A 32^3 GEMM (2 x 32^3 flops) takes 20 ms at this rate. The emulator computes it for real and
  // charges the real time where it is longer: small enough that it never is, even under
  // ThreadSanitizer with the tests in parallel (a 64^3 one took 36 ms there).
  constexpr int kN = 32;
  opt.env["FALCON_EMU_GPU_TFLOPS"] = std::to_string(2.0 * kN * kN * kN / 0.02 / 1e12);
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId&) {
    int failures = 0;
    const Cu cu = Cu::Load(rank);
    void* s = cu.Stream(1);
    const double want = rank == 0 ? 3.0 : 1.0;
    std::vector<double> k;
    const double kernel = MedianKernel(cu, s, 9, [&] { falconEmuLaunchCompute(s, 0.02); }, &k);
    EMU_CHECK(std::fabs(kernel / 0.02 - want) < 0.25 * want, "rank %d: kernel of 20 ms took %.4f s", rank, kernel);
    EMU_CHECK(*std::max_element(k.begin(), k.end()) - *std::min_element(k.begin(), k.end()) > 1e-4,
              "rank %d: no noise between kernels", rank);
    void* blas = nullptr;
    EMU_CHECK(cu.cublas_create(&blas) == 0 && cu.cublas_set_stream(blas, s) == 0, "cublas");
    std::vector<float> a(kN * kN, 1.0f), b(kN * kN, 0.5f), c(kN * kN, -1.0f);
    const float one = 1.0f, zero = 0.0f;
    std::vector<double> g;
    const double gemm = MedianKernel(cu, s, 9, [&] {
      cu.sgemm(blas, 0, 0, kN, kN, kN, &one, a.data(), kN, b.data(), kN, &zero, c.data(), kN);
    }, &g);
    EMU_CHECK(std::fabs(gemm / 0.02 - want) < 0.3 * want, "rank %d: GEMM of 20 ms took %.4f s", rank, gemm);
    EMU_CHECK(c[0] == 0.5f * kN && c[kN * kN - 1] == 0.5f * kN, "GEMM result %g", static_cast<double>(c[0]));
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

// A device wait on a missing peer is unbounded; ncclCommAbort from another thread ends it (the
// stream goes on), and a peer that exits fails it with an asynchronous ncclRemoteError.
TEST(DeviceTest, AbortFromAnotherThreadEndsADeviceWait) {
  Signal rank0_gone;
  RunOptions opt = Quiet(30);
  opt.after_fork = [&] { close(rank0_gone.fds[0]); close(rank0_gone.fds[1]); };
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    const Cu cu = Cu::Load(rank);
    auto* s = static_cast<cudaStream_t>(cu.Stream());
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    if (rank == 1) {  // never calls the all-reduce; leaves once rank 0 exited
      close(rank0_gone.fds[1]);
      rank0_gone.Await();
      return 0;
    }
    float v = 1;
    EMU_CHECK(ncclAllReduce(&v, &v, 1, ncclFloat, ncclSum, comm, s) == ncclSuccess, "enqueue");
    void* done = cu.RecordOn(s);
    EMU_CHECK(!CompletesWithin(cu, done, 0.3), "the all-reduce completed without rank 1");
    std::thread aborter([&] { EMU_CHECK(ncclCommAbort(comm) == ncclSuccess, "abort"); });
    aborter.join();
    EMU_CHECK(CompletesWithin(cu, done, 5), "the stream still waits after the abort");
    EMU_CHECK(falconEmuLaunchCompute(s, 0) == 0 && cu.stream_sync(s) == 0, "the stream goes on after the abort");
    return failures;
  }, opt);
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

// NCCL compares nothing: a count mismatch (collective) or a size mismatch (send/recv) is
// enqueued like any call, and its device work then never completes, on every member, until
// ncclCommAbort; a datatype mismatch at equal byte size completes.
TEST(DeviceTest, MismatchedCallsNeverCompleteUntilAbort) {
  const Meeting checked;
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    const Cu cu = Cu::Load(rank);
    auto* s = static_cast<cudaStream_t>(cu.Stream());
    ncclComm_t same, coll, p2p;
    if (ncclCommInitRank(&same, 2, id, rank) != ncclSuccess) return 2;
    if (ncclCommSplit(same, 0, rank, &coll, nullptr) != ncclSuccess) return 2;
    if (ncclCommSplit(same, 0, rank, &p2p, nullptr) != ncclSuccess) return 2;
    std::vector<float> b(64, 1.0f);
    // 64 floats here, 128 halves there: 256 bytes each.
    EMU_CHECK(ncclAllReduce(b.data(), b.data(), rank == 0 ? 64 : 128, rank == 0 ? ncclFloat : ncclFloat16, ncclSum,
                            same, s) == ncclSuccess, "enqueue same-size");
    EMU_CHECK(CompletesWithin(cu, cu.RecordOn(s), 10), "a same-size datatype mismatch did not complete");
    auto* t = static_cast<cudaStream_t>(cu.Stream());
    EMU_CHECK(ncclAllReduce(b.data(), b.data(), rank == 0 ? 10 : 20, ncclFloat, ncclSum, coll, s) == ncclSuccess,
              "enqueue count mismatch");
    const ncclResult_t p = rank == 0 ? ncclSend(b.data(), 10, ncclFloat, 1, p2p, t) : ncclRecv(b.data(), 20, ncclFloat, 0, p2p, t);
    EMU_CHECK(p == ncclSuccess, "enqueue size mismatch");
    void* coll_done = cu.RecordOn(s);
    void* p2p_done = cu.RecordOn(t);
    EMU_CHECK(cu.event_query(coll_done) == kNotReady, "not ready at once");
    EMU_CHECK(!CompletesWithin(cu, coll_done, 0.3), "the mismatched all-reduce completed");
    EMU_CHECK(!CompletesWithin(cu, p2p_done, 0.1), "the mismatched send/recv completed");
    ncclResult_t async = ncclSuccess;
    EMU_CHECK(ncclCommGetAsyncError(coll, &async) == ncclSuccess && async == ncclSuccess, "async %d", async);
    checked.Meet(rank);
    std::thread aborter([&] {
      EMU_CHECK(ncclCommAbort(coll) == ncclSuccess && ncclCommAbort(p2p) == ncclSuccess, "abort");
    });
    aborter.join();
    EMU_CHECK(CompletesWithin(cu, coll_done, 5) && CompletesWithin(cu, p2p_done, 5), "the streams still wait after the abort");
    EMU_CHECK(ncclCommDestroy(same) == ncclSuccess, "destroy");
    return failures;
  }, Quiet(30));
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

// A stream runs its work in order across communicators, as a GPU: two ranks that queue the
// collectives of two communicators on one stream in opposite orders deadlock (until an abort).
TEST(DeviceTest, OppositeOrdersOnOneStreamDeadlock) {
  const Meeting checked;
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    const Cu cu = Cu::Load(rank);
    auto* s = static_cast<cudaStream_t>(cu.Stream());
    ncclComm_t world, a, b;
    if (ncclCommInitRank(&world, 2, id, rank) != ncclSuccess) return 2;
    if (ncclCommSplit(world, 0, rank, &a, nullptr) != ncclSuccess) return 2;
    if (ncclCommSplit(world, 0, rank, &b, nullptr) != ncclSuccess) return 2;
    float x = 1, y = 1;
    ncclComm_t first = rank == 0 ? a : b, second = rank == 0 ? b : a;
    EMU_CHECK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, first, s) == ncclSuccess, "enqueue first");
    EMU_CHECK(ncclAllReduce(&y, &y, 1, ncclFloat, ncclSum, second, s) == ncclSuccess, "enqueue second");
    void* done = cu.RecordOn(s);
    EMU_CHECK(!CompletesWithin(cu, done, 0.3), "opposite orders on one stream completed");
    checked.Meet(rank);
    std::thread aborter([&] { EMU_CHECK(ncclCommAbort(a) == ncclSuccess && ncclCommAbort(b) == ncclSuccess, "abort"); });
    aborter.join();
    EMU_CHECK(CompletesWithin(cu, done, 5), "the stream still waits after the abort");
    EMU_CHECK(ncclCommDestroy(world) == ncclSuccess, "destroy");
    return failures;
  }, Quiet(30));
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

TEST(DeviceTest, AGonePeerFailsTheDeviceWorkAsynchronously) {
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    const Cu cu = Cu::Load(rank);
    auto* s = static_cast<cudaStream_t>(cu.Stream());
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    if (rank == 1) _exit(0);  // gone without calling the all-reduce
    float v = 1;
    EMU_CHECK(ncclAllReduce(&v, &v, 1, ncclFloat, ncclSum, comm, s) == ncclSuccess, "enqueue");
    void* done = cu.RecordOn(s);
    EMU_CHECK(CompletesWithin(cu, done, 10), "the work never failed");
    ncclResult_t async = ncclSuccess;
    EMU_CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclRemoteError, "async %d", async);
    EMU_CHECK(ncclCommAbort(comm) == ncclSuccess, "abort");
    return failures;
  }, Quiet(30));
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

// Kernels captured on a stream are recorded, not run; each launch of the instantiated graph
// replays them on the launch stream.
TEST(DeviceTest, CapturedKernelsReplayOnGraphLaunch) {
  const auto codes = RunRanks(1, [&](int, const ncclUniqueId&) {
    int failures = 0;
    const Cu cu = Cu::Load(0);
    void* cap = cu.Stream(1);
    void* run = cu.Stream(1);
    EMU_CHECK(cu.begin_capture(cap, 2) == 0, "begin");  // relaxed
    EMU_CHECK(falconEmuLaunchCompute(cap, 0.1) == 0 && falconEmuLaunchCompute(cap, 0.1) == 0, "launch");
    void* graph = nullptr;
    void* exec = nullptr;
    EMU_CHECK(cu.end_capture(cap, &graph) == 0 && graph != nullptr, "end");
    void* idle = cu.RecordOn(cap);
    EMU_CHECK(CompletesWithin(cu, idle, 0.05), "captured kernels ran during the capture");
    EMU_CHECK(cu.instantiate(&exec, graph, 0) == 0, "instantiate");
    void* e0 = cu.RecordOn(run);
    EMU_CHECK(cu.graph_launch(exec, run) == 0 && cu.graph_launch(exec, run) == 0, "launch");
    void* e1 = cu.RecordOn(run);
    EMU_CHECK(cu.event_sync(e1) == 0, "sync");
    const double t = cu.Seconds(e0, e1);
    EMU_CHECK(t >= 0.39 && t < 0.6, "two replays of 2 x 0.1 s took %.3f s", t);
    return failures;
  }, Quiet());
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

// A collective issued on a capturing stream is recorded, not run; each graph launch replays it on
// the launch stream (taking its place in the communicator's sequence at the launch) without
// passing through the NCCL API again; eager calls before and after still match across ranks.
TEST(DeviceTest, CapturedCollectiveReplaysOnGraphLaunch) {
  const auto codes = RunRanks(2, [&](int rank, const ncclUniqueId& id) {
    int failures = 0;
    const Cu cu = Cu::Load(rank);
    auto* cap = static_cast<cudaStream_t>(cu.Stream(1));
    auto* run = static_cast<cudaStream_t>(cu.Stream(1));
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 2;
    std::vector<float> v(64, 1.0f);
    EMU_CHECK(cu.begin_capture(cap, 1) == 0, "begin");  // thread-local
    EMU_CHECK(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, comm, cap) == ncclSuccess, "capture");
    void* graph = nullptr;
    void* exec = nullptr;
    EMU_CHECK(cu.end_capture(cap, &graph) == 0 && graph != nullptr, "end");
    EMU_CHECK(cu.stream_sync(cap) == 0 && v[0] == 1.0f, "the captured all-reduce ran during the capture");
    EMU_CHECK(cu.instantiate(&exec, graph, 0) == 0, "instantiate");
    EMU_CHECK(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, comm, run) == ncclSuccess, "eager");
    EMU_CHECK(cu.graph_launch(exec, run) == 0 && cu.graph_launch(exec, run) == 0, "launch");
    EMU_CHECK(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, comm, run) == ncclSuccess, "eager");
    EMU_CHECK(cu.stream_sync(run) == 0, "sync");
    EMU_CHECK(v[0] == 16.0f && v[63] == 16.0f, "v = %g after 1 eager + 2 replays + 1 eager (want 16)",
              static_cast<double>(v[0]));
    EMU_CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
    return failures;
  }, Quiet());
  EXPECT_TRUE(AllZero(codes)) << Codes(codes);
}

}  // namespace
}  // namespace falcon::emu
