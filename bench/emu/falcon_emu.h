/* Extra C entry points of the NCCL emulator (libnccl.so.2 built from bench/emu), for programs
 * that know they run over the emulator, such as the emulated trainer. They are exported next to
 * the NCCL API and are the only non-NCCL symbols the library exports (prefix falconEmu).
 *
 * Resolve them with dlsym(RTLD_DEFAULT, ...) when the program may also run over the real NCCL.
 * Thread-safety: all are safe to call from any thread at any time.
 * They never block (beyond a bounded wait for another process's placement write), allocate per
 * call, or fail (falconEmuSetPlacement reports errors): a broken configuration reads as "no
 * faults". */
#ifndef FALCON_BENCH_EMU_FALCON_EMU_H_
#define FALCON_BENCH_EMU_FALCON_EMU_H_

#ifdef __cplusplus
extern "C" {
#endif

/* The fault plan's compute slowdown for `globalRank` at `t_s` seconds since the job epoch: the
 * product of the factors of active "compute" faults naming the GPU the rank runs on now, 1.0 when
 * none (the emulator itself ignores compute faults; the trainer applies them to its modelled
 * compute). Compute faults name launch ranks, i.e. the GPUs those ranks were launched on: after
 * falconEmuSetPlacement the k-th lowest rank on a node runs on that node's k-th GPU, so a rank
 * moved off its slow GPU is no longer slowed and a rank moved onto it is (hang faults stay with
 * the rank). */
double falconEmuComputeFactor(int globalRank, double t_s);

/* Modelled time of `flops` floating-point operations of GEMM on `globalRank`'s emulated GPU, now:
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
