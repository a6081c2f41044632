/* Extra C entry points of the NCCL emulator (libnccl.so.2 built from bench/emu), for programs
 * that know they run over the emulator, such as the emulated trainer. They are exported next to
 * the NCCL API and are the only non-NCCL symbols the library exports (prefix falconEmu).
 *
 * Resolve them with dlsym(RTLD_DEFAULT, ...) when the program may also run over the real NCCL.
 * Thread-safety: all are safe to call from any thread at any time.
 * They never block, allocate per call, or fail: a broken configuration reads as "no faults". */
#ifndef FALCON_BENCH_EMU_FALCON_EMU_H_
#define FALCON_BENCH_EMU_FALCON_EMU_H_

#ifdef __cplusplus
extern "C" {
#endif

/* The fault plan's compute slowdown for `globalRank` at `t_s` seconds since the job epoch: the
 * product of the factors of active "compute" faults naming that rank, 1.0 when none (the emulator
 * itself ignores compute faults; the trainer applies them to its modelled compute). */
double falconEmuComputeFactor(int globalRank, double t_s);

/* Modelled time of `flops` floating-point operations of GEMM on `globalRank`'s emulated GPU, now:
 * flops / FALCON_EMU_GPU_TFLOPS (default 10) x the fault plan's compute factor x
 * FALCON_EMU_TIME_SCALE. -1.0 when the model is off (FALCON_EMU_GPU_TFLOPS=0) or the configuration
 * is broken: then a caller measures real host work instead. */
double falconEmuGemmSeconds(int globalRank, double flops);

/* Seconds since the job epoch (FALCON_EMU_EPOCH_NS, else the first communicator's creation time);
 * -1.0 while the epoch is unknown. */
double falconEmuJobSeconds(void);

/* The emulated node of `globalRank` under FALCON_EMU_PLACEMENT / FALCON_EMU_RANKS_PER_NODE. */
int falconEmuNodeOf(int globalRank);

#ifdef __cplusplus
}
#endif

#endif /* FALCON_BENCH_EMU_FALCON_EMU_H_ */
