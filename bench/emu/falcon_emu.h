/* Extra C entry points of the NCCL emulator (libnccl.so.2 built from bench/emu), for programs
 * that know they run over the emulator, such as the emulated trainer. They are exported next to
 * the NCCL API and are the only non-NCCL symbols the library exports (prefix falconEmu).
 *
 * Resolve them with dlsym(RTLD_DEFAULT, ...) when the program may also run over the real NCCL.
 * Thread-safety: all are safe to call from any thread at any time.
 * They never block (beyond a bounded wait for another process's placement write; the kernel
 * launches without a device run their kernel in the caller), allocate per call (except the kernel
 * launches, one small object per kernel), or fail (falconEmuSetPlacement reports errors): a broken configuration reads as "no
 * faults". */
#ifndef FALCON_BENCH_EMU_FALCON_EMU_H_
#define FALCON_BENCH_EMU_FALCON_EMU_H_

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueues a modelled kernel of nominal duration `seconds` (unslowed) on `stream` (a CUstream of
 * the calling thread's current context; 0 = its legacy default stream) and returns once it is
 * queued, as a kernel launch does. On the emulated device (the CUDA driver emulator, libcuda.so.1
 * from bench/emu, loaded by the program) the kernel occupies its stream, in stream order, for
 *   seconds x the compute factor of the GPU this rank runs on when the kernel STARTS
 *   (falconEmuComputeFactor at that moment) x noise,
 * noise being lognormal with sigma FALCON_EMU_COMPUTE_NOISE (default 0.03; 0 = none) from a
 * generator seeded by the rank (and FALCON_EMU_NOISE_SEED). FALCON_EMU_TIME_SCALE does not apply
 * (the caller's seconds are taken as given). Events recorded around it time it; a stream
 * capture records it into the graph. Without the driver emulator or a current context the host
 * is the device: the kernel runs in the calling thread before this returns.
 * Returns 0, or -1 (seconds negative or not finite), -2 (broken configuration), -3 (the driver
 * refused the stream, e.g. an unknown handle). */
int falconEmuLaunchCompute(void* stream, double seconds);

/* The cuBLAS emulator's GEMM launch: a kernel as falconEmuLaunchCompute of nominal duration
 * flops / FALCON_EMU_GPU_TFLOPS x FALCON_EMU_TIME_SCALE (0 when the rate is 0), which runs
 * body(arg) (the real computation) when it starts and release(arg) when done (or at once when
 * it cannot be queued). The kernel lasts the longer of the model and body's own time.
 * Returns as falconEmuLaunchCompute (-1 also for negative flops). */
int falconEmuLaunchGemm(void* stream, double flops, void (*body)(void*), void* arg, void (*release)(void*));

/* The fault plan's compute slowdown for `globalRank` at `t_s` seconds since the job epoch: the
 * product of the factors of active "compute" faults naming the GPU the rank runs on now, 1.0 when
 * none. The emulated device applies it to every kernel (falconEmuLaunchCompute, the cuBLAS
 * emulator's GEMMs); this export remains for programs that model compute themselves (the
 * emulated trainer, until it launches its compute as kernels). Compute faults name launch ranks, i.e. the GPUs those ranks were launched on: after
 * falconEmuSetPlacement the k-th lowest rank on a node runs on that node's k-th GPU, so a rank
 * moved off its slow GPU is no longer slowed and a rank moved onto it is (hang faults stay with
 * the rank). */
double falconEmuComputeFactor(int globalRank, double t_s);

/* Kept only for programs outside the shim that model GEMMs themselves (the emulated trainer may,
 * for a while); nothing in Falcon's shim or daemons uses it: the shim measures GEMMs on the device.
 * Modelled time of `flops` floating-point operations of GEMM on `globalRank`'s emulated GPU, now:
 * flops / FALCON_EMU_GPU_TFLOPS (default 10) x falconEmuComputeFactor x FALCON_EMU_TIME_SCALE.
 * -1.0 when the model is off (FALCON_EMU_GPU_TFLOPS=0) or the configuration is broken: then a
 * caller measures real host work instead. */
double falconEmuGemmSeconds(int globalRank, double flops);

/* Seconds since the job epoch (FALCON_EMU_EPOCH_NS, else the first communicator's creation time);
 * -1.0 while the epoch is unknown. */
double falconEmuJobSeconds(void);

/* The emulated node of `globalRank` now: the job's placement override (falconEmuSetPlacement)
 * when it covers the rank, else the launch node. Every process of the job sees a change as soon
 * as falconEmuSetPlacement returns in the process that made it. */
int falconEmuNodeOf(int globalRank);

/* The node of `globalRank` at launch: FALCON_EMU_PLACEMENT, else globalRank /
 * FALCON_EMU_RANKS_PER_NODE (default 8); falconEmuSetPlacement does not change it. */
int falconEmuLaunchNodeOf(int globalRank);

/* Re-places the job's ranks: from now on global rank r (0 <= r < n) sits on node_of_rank[r]
 * (ranks >= n on their launch node), for every process of the job (the override lives in the
 * job state FALCON_EMU_JOB_STATE, which falcon-emu-run sets up). The fabric model charges every
 * operation launched after the change by the new nodes; link and nic faults stay on physical
 * node indices. n = 0 restores the launch placement; installing the placement in force again is
 * a no-op, so every rank of a job may make the same call. Change it only while the job is
 * quiescent (no operation in flight that a changed rank takes part in).
 * Returns 0 on success, -1 for invalid arguments (n < 0, NULL with n > 0, n > 65536, a node
 * outside [0, 65535]), -2 when there is no job state (FALCON_EMU_JOB_STATE unset or unusable),
 * -3 when another writer held the state for over a second. Nothing changes on failure. */
int falconEmuSetPlacement(const int* node_of_rank, int n);

/* Modelled seconds to move `bytes` from node srcNode to node dstNode now: the fabric model's
 * point-to-point time (intra/inter-node bandwidth and latency, link and nic faults active now,
 * FALCON_EMU_TIME_SCALE); 0 when FALCON_EMU_FABRIC=off, -1.0 for invalid arguments or a broken
 * configuration. For modelling traffic the program does not really send (e.g. moving a rank's
 * state to another node). */
double falconEmuTransferSeconds(int srcNode, int dstNode, double bytes);

#ifdef __cplusplus
}
#endif

#endif /* FALCON_BENCH_EMU_FALCON_EMU_H_ */
