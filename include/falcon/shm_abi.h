/* Falcon shared-memory ABI: the call log and control block a shim shares with the agent.
 *
 * One segment per traced process, created by libfalcon_shim.so on the process's first NCCL call
 * at  <dir>/falcon.<uid>.<boot>.<pidns>.<pid>  (dir: $FALCON_SHM_DIR, default /dev/shm; boot:
 * the 32 hex digits of /proc/sys/kernel/random/boot_id; pidns: the inode number of
 * /proc/self/ns/pid in decimal; pid: the process id in its own PID namespace), mode 0600,
 * removed when the process exits normally. The name is unique on a node even when containers
 * with their own PID namespaces share the directory: two processes with the same pid differ in
 * pidns. A name the shim cannot fill in (no /proc) uses 0 for that part; see segment liveness.
 * Names of ABI 4 and older (falcon.<uid>.<pid>) are not segments of this ABI.
 *
 * Segment liveness (who may remove a segment; FalconShmHeader):
 *  - A process that ran its exit handlers stores state = kFalconProcExited.
 *  - The shim holds an open-file-description write lock (fcntl F_OFD_SETLK, F_WRLCK, the whole
 *    file) on the segment for the life of the process; the kernel drops it when the process
 *    dies, in any PID namespace. A reader tests it with F_OFD_GETLK (no lock is taken). Forked
 *    children close their inherited descriptor, so a lock held means the creator (or a stopped,
 *    frozen or starved creator) is alive.
 *  - The service thread refreshes FalconControl::heartbeat_* about every 50 ms while
 *    shim_flags has kFalconShimHeartbeat; without that flag the heartbeat says nothing.
 *  - In the writer's own PID namespace (equal boot_id and pid_ns) pid + pid_start_ticks is exact.
 * A crashed process leaves its segment behind; readers recognise it and reap it.
 *
 * Layout (all offsets from the segment start, all sizes in bytes, native layout of x86_64 /
 * aarch64 Linux):
 *   [FalconShmHeader][FalconControl][FalconPlanBlock][FalconCommEntry x comm_capacity]
 *   [FalconThreadSlot x thread_capacity][FalconLane x lane_count]
 *   [FalconRecord x lane_capacity] x lane_count            (lane l's ring follows lane l-1's)
 * Every region starts 64-byte aligned at the offset the header names (control_offset,
 * plan_offset, comm_offset, ...); readers take offsets from the header, never from this picture.
 *
 * Records go to per-thread lanes so that the hot path needs no locked instruction: thread
 * slot t (in order of each thread's first NCCL call) owns lane t exclusively while
 * t < lane_count - 1; the last lane is shared by all further threads and by the shim's own
 * service thread. A process's calls in time order are the lanes merged by t_start_mono_ns.
 *
 * Concurrency contract (writer = the traced process, reader = agent / falcon-ctl):
 *  1. The header's identity fields are written once, before `magic` is published with release
 *     order; a reader that sees the magic sees the rest.
 *  2. Lane index i of lane l lives in ring slot l * lane_capacity + i % lane_capacity. A slot is
 *     a seqlock: its `version` is odd (2i+1) while being written and 2i+2 once complete. A
 *     reader accepts a copy only if it read the same even version before and after the copy and
 *     that version equals 2i+2 for the index it expected. A larger version means the record was
 *     overwritten (lost to that reader); a smaller or odd one that it is not complete yet (or
 *     torn, if the writer is gone).
 *  3. An exclusive lane has one writer: it advances `head` with a plain atomic store. A shared
 *     lane's writers claim indices with fetch_add on `head` and the slot with a CAS on
 *     `version`; a writer never waits: if the slot is still being written by a slower writer it
 *     drops its record and counts it in the lane's `records_dropped`.
 *  4. Writers count records that overwrite an index the lane's reader has not consumed yet
 *     (`reader_cursor`, published by the single active reader) in the lane's `records_lost`.
 *  5. Comm entries are written under their own `state` word: kFalconCommWriting while the
 *     identity is filled in, then kFalconCommLive; `destroy_*` are written before
 *     kFalconCommDestroyed. `calls` is the per-communicator sequence counter (ordered calls).
 *  6. The control block's agent→shim words are written by the agent only, the shim→agent words
 *     by the shim only; all are naturally aligned atomics.
 *  7. The plan block's plan part (FalconPlanBlock) is a seqlock with one writer, the agent: it
 *     makes `seq` odd, fills the fields and arrays, stores `version` (release), then makes `seq`
 *     even again. A reader copies with atomic loads between two loads of `seq` and keeps the copy
 *     only if both saw the same even value; otherwise it retries a bounded number of times and
 *     then gives up (FALCON_ERR_BUSY in falcon.h). `version` alone may be read without the
 *     seqlock: a reader that sees a version sees its arrays complete. seq 0 = never written.
 *     The ack and cost words are written by the shim only (falconAckPlan, falconReportCost),
 *     each an atomic on its own.
 *  8. Progress of a communicator (FalconCommEntry: device_done, marked, last_call_mono_ns,
 *     done_mono_ns) is written by the shim only. Where a CUDA driver is loaded, the shim records
 *     an event after each ordered call's device work (for calls inside a group: at the group's
 *     outermost ncclGroupEnd) and its service thread polls them (~50 ms): device_done is then
 *     1 + the latest comm_seq seen complete, so calls before it completed too where the
 *     communicator's calls share one stream. Calls whose completion cannot be tracked (no
 *     driver, a stream being captured into a CUDA graph, a nonblocking call still in progress,
 *     the event pool busy) are not marked: calls at or after `marked` are of unknown state once
 *     device_done reached `marked`. last_call_mono_ns is kept in every mode but off.
 *     FALCON_DEVICE_PROGRESS=0 turns the events off (marked stays 0: nothing is tracked).
 *
 * Nothing in this file depends on NCCL or CUDA: enum values mirror nccl.h where they must.
 * C and C++ may both include it. */
#ifndef FALCON_SHM_ABI_H_
#define FALCON_SHM_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FALCON_SHM_MAGIC 0x4641434C4E534D31ull /* "FACLNSM1" */
#define FALCON_SHM_ABI_VERSION 8u /* 8: device completion and last-call time per communicator,
                                    unordered calls in flight; 7: pipeline warm-up counts in the plan block; 6: pause targets on several communicators; 5: pid_ns, boot_id,
                                    shim_flags; names with boot and pidns; comm_seq of ordered
                                    calls only; validation tasks and blobs */
#define FALCON_SHM_PREFIX "falcon."
#define FALCON_SHM_DEFAULT_DIR "/dev/shm"
#define FALCON_NO_COMM 0xFFFFFFFFu
#define FALCON_NAME_LEN 64
#define FALCON_HOST_LEN 64

/* Every function of nccl.h 2.28 has an op code; collectives come first. The order is ABI. */
typedef enum {
  kFalconOpNone = 0,
  kFalconOpAllReduce = 1,
  kFalconOpBroadcast = 2,
  kFalconOpBcast = 3,
  kFalconOpReduce = 4,
  kFalconOpAllGather = 5,
  kFalconOpReduceScatter = 6,
  kFalconOpAlltoAll = 7,
  kFalconOpGather = 8,
  kFalconOpScatter = 9,
  kFalconOpSend = 10,
  kFalconOpRecv = 11,
  kFalconOpGroupStart = 12,
  kFalconOpGroupEnd = 13,
  kFalconOpGroupSimulateEnd = 14,
  kFalconOpCommInitRank = 15,
  kFalconOpCommInitRankConfig = 16,
  kFalconOpCommInitRankScalable = 17,
  kFalconOpCommInitAll = 18,
  kFalconOpCommSplit = 19,
  kFalconOpCommShrink = 20,
  kFalconOpCommFinalize = 21,
  kFalconOpCommDestroy = 22,
  kFalconOpCommAbort = 23,
  kFalconOpCommRevoke = 24,
  kFalconOpCommRegister = 25,
  kFalconOpCommDeregister = 26,
  kFalconOpCommWindowRegister = 27,
  kFalconOpCommWindowDeregister = 28,
  kFalconOpRedOpCreatePreMulSum = 29,
  kFalconOpRedOpDestroy = 30,
  kFalconOpGetUniqueId = 31,
  kFalconOpGetVersion = 32,
  kFalconOpGetErrorString = 33,
  kFalconOpGetLastError = 34,
  kFalconOpCommGetAsyncError = 35,
  kFalconOpCommCount = 36,
  kFalconOpCommCuDevice = 37,
  kFalconOpCommUserRank = 38,
  kFalconOpMemAlloc = 39,
  kFalconOpMemFree = 40,
  /* Not an NCCL call: GPU timing of record `ref_seq` completed (see FalconRecord). */
  kFalconOpGpuTiming = 100,
  /* Not an NCCL call: an annotation. count = kFalconAnnotatePause* (trap start/end), or a
   * phase from the C API; t_start_ns is when it happened. */
  kFalconOpAnnotation = 101,
  kFalconOpCount_ = 102  /* op codes fit in a byte */
} FalconOp;

/* Whether `op` is ordered across the ranks of its communicator: every member issues it, in
 * the same order relative to the communicator's other ordered calls (collectives, send/recv,
 * the calls that create a communicator, and Split/Shrink/Finalize on the parent). Only ordered
 * calls take a comm_seq, so the n-th ordered call has the same comm_seq on every member;
 * queries, error polls (which other threads such as PyTorch's watchdog make at any time),
 * registration, reduction operators, destroy/abort/revoke record comm_seq ~0. */
static inline int FalconOpIsOrdered(unsigned op) {
  return (op >= 1 && op <= 11) || (op >= 15 && op <= 21);
}

/* Whether `op` is a query: it asks NCCL about a communicator or the library and changes
 * nothing (version, error strings, asynchronous errors, rank, size, device). Queries are counted
 * per lane (FalconLane::queries), never recorded: PyTorch's watchdog and its wait loops for
 * nonblocking communicators poll ncclCommGetAsyncError thousands of times a second, and one
 * record each would overwrite the job's collectives in the ring. */
static inline int FalconOpIsQuery(unsigned op) {
  return op >= 32 && op <= 38;
}

/* FalconRecord::count of kFalconOpAnnotation records written by the trap. */
enum {
  kFalconAnnotatePauseBegin = 1,
  kFalconAnnotatePauseEnd = 2,
  kFalconAnnotatePhase = 3  /* the framework entered phase `peer` (FalconPhase, falcon.h) */
};

/* Record flags. */
enum {
  kFalconFlagInGroup = 1u << 0,      /* issued between ncclGroupStart and ncclGroupEnd */
  kFalconFlagGraphCapture = 1u << 1, /* the stream was being captured into a CUDA graph */
  kFalconFlagBenchmark = 1u << 2,    /* issued by Falcon's benchmark executor, not training */
  kFalconFlagGpuPending = 1u << 3,   /* a kFalconOpGpuTiming record for this call will follow */
  kFalconFlagHostEnd = 1u << 4,      /* t_end_mono_ns holds the host time the call returned */
  kFalconFlagInPlace = 1u << 5       /* sendbuff == recvbuff */
};

/* One NCCL call: 64 bytes, one cache line. Times are CLOCK_MONOTONIC nanoseconds; the wall
 * clock time is t_start_ns + FalconShmHeader::real_minus_mono_ns. The record's index in its
 * lane is version / 2 - 1; (t_start_ns, lane, index) orders a process's records globally.
 * comm_slot names the communicator the call is on: for InitRank* the new communicator, for
 * Split/Shrink the parent (a collective on it), for InitAll the first new one (count = ndev).
 * `aux` holds the stream for calls that take one; for Split/Shrink the child's comm slot
 * (FALCON_NO_COMM if the rank got none, and peer = color / number excluded); for
 * RedOpCreatePreMulSum the created op. For kFalconOpGpuTiming records: t_start_ns/t_end_ns
 * are the GPU start/end of the call whose lane index is comm_seq in lane `peer`; result 0 on
 * success, 1 if the events failed. */
typedef struct FalconRecord {
  uint64_t version;     /* seqlock, see contract 2 */
  uint64_t comm_seq;    /* position among the communicator's ordered calls (FalconOpIsOrdered),
                         * 0-based, alike on every member; ~0 if no communicator or not ordered */
  uint64_t count;       /* element count as passed (sendcount for AllGather) */
  uint64_t aux;         /* stream, child comm slot or created op (see above) */
  int64_t t_start_ns;   /* at entry */
  int64_t t_end_ns;     /* at return, when kFalconFlagHostEnd; else 0 */
  uint32_t comm_slot;   /* index into the comm table, FALCON_NO_COMM if none */
  int32_t peer;         /* peer (Send/Recv) or root (Bcast/Reduce/Gather/Scatter), else -1 */
  int16_t redop;        /* ncclRedOp_t (32767 if larger), -1 if none */
  uint8_t op;           /* FalconOp */
  uint8_t dtype;        /* ncclDataType_t, 0xFF if none */
  uint8_t group_depth;  /* ncclGroupStart nesting depth at entry (saturates at 255) */
  uint8_t flags;        /* kFalconFlag* */
  uint8_t result;       /* ncclResult_t returned to the caller */
  uint8_t lane;         /* the lane this record was written to */
} FalconRecord;

typedef enum {
  kFalconCommFree = 0,
  kFalconCommWriting = 1,
  kFalconCommLive = 2,
  kFalconCommDestroyed = 3
} FalconCommState;

typedef enum {
  kFalconCommByInitRank = 1,
  kFalconCommByInitRankConfig = 2,
  kFalconCommByInitRankScalable = 3,
  kFalconCommByInitAll = 4,
  kFalconCommBySplit = 5,
  kFalconCommByShrink = 6
} FalconCommOrigin;

/* One communicator this process is a member of. comm_id is computed alike by every member:
 * FNV-1a 64 of the ncclUniqueId for InitRank*; for Split/Shrink a hash of (parent comm_id, how
 * many splits/shrinks the parent had before this one, color or sorted excluded ranks); for
 * InitAll a hash of (host, pid, InitAll call index, device list). */
typedef struct FalconCommEntry {
  uint32_t state;          /* FalconCommState, atomic */
  uint32_t origin;         /* FalconCommOrigin */
  uint64_t comm_id;
  uint64_t parent_id;      /* 0 if none */
  int32_t rank;
  int32_t nranks;
  int32_t device;          /* CUDA device ordinal, -1 if unknown */
  int32_t color;           /* Split color, or number of excluded ranks for Shrink; -1 otherwise */
  uint32_t split_index;    /* n-th split/shrink of the parent (0-based) */
  uint32_t children;       /* splits/shrinks made from this communicator so far, atomic */
  uint64_t handle;         /* ncclComm_t value, process-local, informational */
  int64_t create_real_ns;
  int64_t create_mono_ns;
  int64_t destroy_real_ns; /* 0 while live */
  int64_t destroy_mono_ns;
  uint64_t calls;          /* ordered calls so far (the next comm_seq), atomic */
  char name[FALCON_NAME_LEN]; /* commName from ncclConfig_t, NUL-terminated, may be empty */
  /* Progress (contract 8), each an atomic on its own: */
  uint64_t device_done;       /* ordered calls whose device work is known to have completed */
  uint64_t marked;            /* 1 + the latest comm_seq whose completion is tracked, 0: none */
  int64_t last_call_mono_ns;  /* entry time of the latest ordered call, 0: none yet */
  int64_t done_mono_ns;       /* when device_done last advanced, 0: never */
} FalconCommEntry;

/* One calling thread; lets a reader see calls that have not returned (hangs). Recorded in the
 * track, profile and sample modes (not in off). */
#define FALCON_INFLIGHT_UNORDERED 0xFFFFFFFFFFFFFFFFull
typedef struct FalconThreadSlot {
  uint64_t tid;            /* gettid() of the owner, 0 if free (slots are reused after a thread exits) */
  uint64_t inflight_seq;   /* atomic: 0 = idle, FALCON_INFLIGHT_UNORDERED = a call without a
                              comm_seq (group end, init, ...) in flight, else 1 + its comm_seq */
  int64_t inflight_since_mono_ns;
  uint32_t inflight_comm_slot;
  uint16_t inflight_op;
  uint16_t reserved0;
  uint8_t reserved[32];
} FalconThreadSlot;

/* One lane's indices and counters (64 bytes). */
typedef struct FalconLane {
  uint64_t head;            /* next lane index to write, atomic */
  uint64_t reader_cursor;   /* reader → shim: next index the active reader will consume */
  uint64_t records_lost;    /* overwrote a record the reader had not consumed, atomic */
  uint64_t records_dropped; /* could not be written (slot still busy; shared lane only), atomic */
  uint32_t shared;          /* 1 for the shared (multi-writer) lane */
  uint32_t owner_thread;    /* thread slot that owns an exclusive lane, 0xFFFFFFFF if none yet */
  uint64_t queries;         /* calls of this lane's threads that are counted, not recorded
                               (FalconOpIsQuery), atomic */
  uint8_t reserved[16];
} FalconLane;

typedef enum {
  kFalconModeTrack = 0,   /* host timestamps only (default) */
  kFalconModeProfile = 1, /* GPU events on every call (host end time where there is no GPU) */
  kFalconModeSample = 2,  /* like profile on one call in `sample_every` */
  kFalconModeOff = 3      /* record nothing; calls pass through (communicators are still
                           * registered and ordered calls counted, so identities and comm_seq
                           * stay alike on every member when recording resumes) */
} FalconMode;

typedef enum {
  kFalconTimingHost = 0,  /* no usable CUDA driver: host timing only */
  kFalconTimingCudaEvents = 1
} FalconTimingSource;

/* Benchmark tasks the executor runs while the process is trapped (paused). */
typedef enum {
  kFalconTaskNone = 0,
  kFalconTaskGemm = 1, /* m x n x k GEMM of `dtype` on this rank's device (host GEMM, fp32 only, without a GPU) */
  kFalconTaskP2p = 2,  /* one send and/or one receive of `bytes`; comm_slot FALCON_VALIDATION_COMM:
                          on the validation communicator (ranks are its ranks), else on a
                          training communicator of this process's table */
  kFalconTaskCommId = 3,   /* make an ncclUniqueId for a validation communicator: task_result_blob */
  kFalconTaskCommJoin = 4  /* join the validation communicator of the unique id in task_blob as rank
                              n of m (nonblocking init, ready or failed by the deadline) and
                              allocate its transfer buffers of `bytes`: "ok" means every member
                              has joined and this rank can post at once */
} FalconTaskKind;

/* FalconTask::comm_slot of P2P tasks on the validation communicator: one communicator Falcon
 * owns, made during a pause by kFalconTaskCommJoin, never one of the job's. It lives until the
 * pause ends (resumed or timed out), when the shim aborts it; a task that misses its deadline
 * aborts it at once, so that no peer's transfer waits on it. */
#define FALCON_VALIDATION_COMM 0xFFFFFFFEu
#define FALCON_TASK_BLOB_LEN 128 /* sizeof(ncclUniqueId) */

typedef enum {
  kFalconTaskOk = 0,
  kFalconTaskBadRequest = 1,  /* malformed task (unknown kind, bad slot, sizes out of range) */
  kFalconTaskUnsupported = 2, /* not available in this process (e.g. GPU buffers not implemented) */
  kFalconTaskFailed = 3       /* NCCL or memory error; detail is in the shim's log */
} FalconTaskStatus;

/* 64 bytes. P2P: ranks are ranks in the communicator at comm_slot of this process's table. */
#define FALCON_P2P_WARMUP_BYTES 65536

/* Element type of a GEMM task: fp32 is cuBLAS SGEMM (no tensor cores unless the library chooses
 * TF32); bf16 and fp16 are cublasGemmEx with fp32 accumulation, the tensor-core path training
 * uses. Zero is fp32, so agents that predate the field ask for what they always got. */
typedef enum {
  kFalconGemmF32 = 0,
  kFalconGemmBf16 = 1,
  kFalconGemmF16 = 2
} FalconGemmType;

typedef struct FalconTask {
  uint32_t kind;       /* FalconTaskKind */
  uint32_t repeats;    /* timed repetitions, 1..1000 (after one untimed warm-up; a P2P warm-up
                          moves min(bytes, FALCON_P2P_WARMUP_BYTES): it sets up connections) */
  uint32_t comm_slot;  /* P2P: the communicator */
  int32_t send_peer;   /* P2P: rank to send to, -1 for none */
  int32_t recv_peer;   /* P2P: rank to receive from, -1 for none */
  uint32_t m, n, k;    /* GEMM dimensions, 1..8192; CommJoin: m = members, n = this rank */
  uint64_t bytes;      /* P2P message size, 1 B..1 GiB; CommJoin: transfer buffer size */
  int64_t deadline_real_ns; /* CLOCK_REALTIME: the task fails (and the validation communicator
                               is aborted) if not done by then; 0 or past the pause's deadline:
                               the pause's deadline */
  uint8_t dtype;       /* GEMM: FalconGemmType */
  uint8_t reserved[15];
} FalconTask;

/* 64 bytes. Times in seconds over the timed repetitions. */
typedef struct FalconTaskResult {
  uint64_t task_seq;   /* which task this is the result of */
  uint32_t kind;
  int32_t status;      /* FalconTaskStatus */
  double median_s;
  double min_s;
  double max_s;
  double rate;         /* GEMM: GFLOP/s; P2P: GB/s (bytes moved per direction / median) */
  uint32_t timing_source; /* FalconTimingSource */
  uint8_t dtype;       /* GEMM: the FalconGemmType that ran (a shim that predates it leaves 0, fp32) */
  uint8_t reserved[11];
} FalconTaskResult;

typedef enum {
  kFalconPauseIdle = 0,    /* no pause requested, or the last one ended */
  kFalconPauseArmed = 1,   /* waiting for the target call */
  kFalconPauseTrapped = 2, /* stopped before the target call; tasks run now */
  kFalconPauseMissed = 3,  /* the target call had already been issued: not trapped */
  kFalconPauseExpired = 4, /* the deadline passed before the target call: not trapped */
  kFalconPauseTimedOut = 5,/* trapped, but not resumed by the deadline: training went on */
  kFalconPauseResumed = 6, /* trapped and resumed on request */
  kFalconPauseRejected = 7 /* malformed request (bad comm slot, deadline in the past) */
} FalconPauseState;

/* One communicator's stop: the call with comm_seq `seq` on comm slot `comm_slot`. 16 bytes. */
typedef struct FalconPauseTarget {
  uint32_t comm_slot;
  uint32_t reserved;
  uint64_t seq;
} FalconPauseTarget;

#define FALCON_PAUSE_MAX_TARGETS 16             /* communicators one pause may name per rank */
#define FALCON_PAUSE_MAX_NS 3600000000000ll     /* a pause deadline at most 1 h ahead */

/* The control block. agent→shim words: written by the agent, read by the shim. shim→agent
 * words: written by the shim. Protocol:
 *  - mode: write mode/sample_every, then increment command_seq; the shim applies it within a
 *    service tick (~50 ms) and copies command_seq to command_ack.
 *  - pause (a consistent cut): write the targets and pause_deadline_real_ns, then increment
 *    pause_gen. Targets: pause_target_count entries of pause_targets, or, when the count is 0,
 *    the one target (pause_comm_slot, pause_comm_seq). The shim stops the thread that is about to
 *    issue an ordered call whose comm_seq (0-based, as in FalconRecord::comm_seq) equals its
 *    communicator's target, before issuing it (inside a group: right after the group's end); a
 *    call whose comm_seq is past its target means the cut was missed. Targets chosen so that
 *    every member of every communicator has issued the same calls at its stop make the cut
 *    consistent: no rank waits inside a collective that a paused peer has not issued (the reader
 *    checks FalconCommEntry::calls once trapped). pause_state/pause_ack_gen report progress.
 *    Resume: set resume_gen = pause_gen. Every wait has the deadline (at most
 *    FALCON_PAUSE_MAX_NS ahead, else Rejected): armed past it → Expired; trapped past it →
 *    TimedOut and training continues.
 *  - tasks (only while trapped): write task, then increment task_seq; the shim runs it on the
 *    trapped thread and writes task_result, then task_ack = task_seq. */
typedef struct FalconControl {
  /* agent → shim */
  uint32_t mode;              /* FalconMode */
  uint32_t sample_every;      /* for kFalconModeSample; 0 is treated as 1 */
  uint64_t command_seq;       /* bumped by the agent after changing mode/sample_every */
  uint64_t pause_gen;         /* bumped to request a pause */
  uint32_t pause_comm_slot;
  uint32_t pause_target_count; /* 0..FALCON_PAUSE_MAX_TARGETS; 0: pause_comm_slot/seq */
  uint64_t pause_comm_seq;
  int64_t pause_deadline_real_ns; /* CLOCK_REALTIME */
  FalconPauseTarget pause_targets[FALCON_PAUSE_MAX_TARGETS];
  uint64_t resume_gen;        /* = pause_gen to resume */
  uint64_t task_seq;
  FalconTask task;
  uint8_t task_blob[FALCON_TASK_BLOB_LEN]; /* kFalconTaskCommJoin: the unique id (before task_seq) */
  /* shim → agent */
  uint64_t command_ack;       /* last command_seq the shim applied */
  uint32_t active_mode;       /* the mode the shim is actually using */
  uint32_t timing_source;     /* FalconTimingSource */
  int64_t heartbeat_mono_ns;  /* refreshed by the shim's service thread (~every 50 ms) */
  int64_t heartbeat_real_ns;
  uint64_t pause_ack_gen;     /* the pause_gen that pause_state refers to */
  uint32_t pause_state;       /* FalconPauseState */
  uint32_t trapped_comm_slot; /* trapped before an ordered call: its comm slot, whose `calls`
                                 already counts it (its comm_seq is taken, the call not issued);
                                 FALCON_NO_COMM when stopped after a group end */
  int64_t trapped_real_ns;    /* when the thread stopped (0 if it did not) */
  int64_t resumed_real_ns;    /* when it went on */
  uint64_t task_ack;
  FalconTaskResult task_result;
  uint8_t task_result_blob[FALCON_TASK_BLOB_LEN]; /* kFalconTaskCommId: the unique id made */
  uint32_t phase;             /* FalconPhase (falcon.h) the framework annotated, 0 = training */
  uint32_t reserved4;
  int64_t phase_since_real_ns; /* when it entered that phase, CLOCK_REALTIME (0: never set) */
  uint8_t reserved3[40];
} FalconControl;

/* Capacities of the plan block's arrays (entries). A plan command whose arrays exceed them is
 * refused by the agent (ack "rejected"); the plan is never truncated in shared memory. */
#define FALCON_PLAN_MAX_MICRO_BATCHES 4096 /* DP replicas (the protocol's own limit) */
#define FALCON_PLAN_MAX_PLACEMENT 16384    /* global ranks a placement may list */
#define FALCON_PLAN_MAX_EXCLUDE 1024       /* nodes an S4 restart may leave out */
#define FALCON_PLAN_MAX_STAGES 1024        /* pipeline stages a warm-up plan may list */

/* The mitigation plan in force (agent → shim) and the framework's answers (shim → agent);
 * read and acknowledged through include/falcon/falcon.h. 90,240 bytes. */
typedef struct FalconPlanBlock {
  /* agent → shim, under the seqlock (contract 7) */
  uint64_t seq;               /* odd while the agent writes; even when stable; 0: never written */
  uint32_t version;           /* plan version, 0 = no plan; written last (release) */
  uint32_t strategy;          /* FalconStrategy (falcon.h): 0 none, 1..4 = S1..S4 */
  uint32_t restart;           /* 1: restart from the last checkpoint (S4) */
  uint32_t micro_batch_count; /* valid entries of micro_batches, <= FALCON_PLAN_MAX_MICRO_BATCHES */
  uint32_t placement_count;   /* valid entries of placement, <= FALCON_PLAN_MAX_PLACEMENT */
  uint32_t exclude_count;     /* valid entries of exclude_nodes, <= FALCON_PLAN_MAX_EXCLUDE */
  int64_t issued_real_ns;     /* when the agent wrote it, CLOCK_REALTIME ns */
  uint32_t warmup_count;      /* valid entries of warmup, <= FALCON_PLAN_MAX_STAGES (ABI 7) */
  uint8_t reserved0[20];
  /* shim → agent: written by falconAckPlan, every word an atomic on its own */
  uint64_t ack_last;          /* latest ack: version << 32 | (uint32_t)status; 0: none yet */
  uint64_t ack_count;         /* falconAckPlan calls so far */
  uint32_t applied_version;   /* highest version acked with status 0 (0: none) */
  uint32_t rejected_version;  /* highest version acked with status != 0 (0: none) */
  /* written by falconReportCost: what applying S2, S3, S4 and the pipeline plan costs this rank
   * (index strategy - 2), in microseconds of lost training; 0: never reported. The fourth word
   * was reserved (zero) before API version 4: older shims leave it unreported. */
  uint64_t cost_us[4];
  uint8_t reserved1[8];
  /* agent → shim arrays, under the seqlock; entries past each count are meaningless */
  int32_t micro_batches[FALCON_PLAN_MAX_MICRO_BATCHES]; /* per DP replica, 1..4096 */
  int32_t placement[FALCON_PLAN_MAX_PLACEMENT];         /* node index of each global rank */
  int32_t exclude_nodes[FALCON_PLAN_MAX_EXCLUDE];       /* node indices */
  int32_t warmup[FALCON_PLAN_MAX_STAGES];               /* warm-up forwards per pipeline stage (ABI 7) */
} FalconPlanBlock;

typedef enum {
  kFalconProcRunning = 1,
  kFalconProcExited = 2 /* the process ran its exit handlers; the segment is complete */
} FalconProcState;

/* FalconShmHeader::shim_flags. */
enum {
  kFalconShimHeartbeat = 1u << 0 /* the service thread runs: heartbeat_* are refreshed ~every 50 ms */
};

typedef struct FalconShmHeader {
  uint64_t magic;            /* FALCON_SHM_MAGIC, published last (release) */
  uint32_t abi_version;      /* FALCON_SHM_ABI_VERSION */
  uint32_t header_size;      /* sizeof(FalconShmHeader) */
  uint32_t control_size;     /* sizeof(FalconControl) */
  uint32_t comm_entry_size;  /* sizeof(FalconCommEntry) */
  uint32_t thread_slot_size; /* sizeof(FalconThreadSlot) */
  uint32_t record_size;      /* sizeof(FalconRecord) */
  uint32_t comm_capacity;
  uint32_t thread_capacity;
  uint32_t lane_count;       /* >= 2; the last lane is shared */
  uint32_t lane_size;        /* sizeof(FalconLane) */
  uint64_t lane_capacity;    /* records per lane, a power of two */
  uint64_t control_offset;
  uint64_t comm_offset;
  uint64_t thread_offset;
  uint64_t lane_offset;
  uint64_t ring_offset;
  uint64_t segment_size;
  int32_t pid;               /* in the writer's own PID namespace (pid_ns) */
  uint32_t uid;
  uint64_t pid_start_ticks;  /* field 22 of /proc/pid/stat: tells a reused pid apart */
  int64_t created_real_ns;
  int64_t created_mono_ns;
  int64_t real_minus_mono_ns;/* CLOCK_REALTIME - CLOCK_MONOTONIC, refreshed by the shim, atomic */
  int32_t rank_hint;         /* from RANK / OMPI_COMM_WORLD_RANK / SLURM_PROCID, -1 if none */
  int32_t local_rank_hint;   /* from LOCAL_RANK / OMPI_COMM_WORLD_LOCAL_RANK, -1 if none */
  uint32_t state;            /* FalconProcState, atomic */
  uint32_t shim_flags;       /* kFalconShim*, atomic (ABI 5) */
  char host[FALCON_HOST_LEN];
  char job[FALCON_NAME_LEN]; /* $FALCON_JOB, may be empty */
  char exe[FALCON_NAME_LEN]; /* basename of /proc/self/exe */
  /* shim → reader counters, atomics */
  uint64_t comm_overflow;    /* communicators beyond comm_capacity (recorded with FALCON_NO_COMM) */
  uint64_t internal_errors;  /* internal failures that made the shim pass through */
  uint32_t comm_used;        /* comm entries handed out so far (may exceed comm_capacity) */
  uint32_t thread_used;      /* thread slots handed out so far (may exceed thread_capacity) */
  uint64_t plan_offset;      /* the FalconPlanBlock (ABI 4) */
  uint32_t plan_size;        /* sizeof(FalconPlanBlock) */
  uint32_t reserved0;
  uint64_t pid_ns;           /* inode of the writer's /proc/self/ns/pid, 0 if unknown (ABI 5) */
  uint8_t boot_id[16];       /* /proc/sys/kernel/random/boot_id as bytes, zeros if unknown (ABI 5) */
  uint64_t untracked_calls;  /* calls with device work whose completion could not be tracked while
                                a CUDA driver was loaded (graph capture, a nonblocking call in
                                progress, event pool busy, too many streams in one group; contract
                                8), atomic (ABI 8) */
  uint8_t reserved[216];
} FalconShmHeader;

#ifdef __cplusplus
} /* extern "C" */

static_assert(sizeof(FalconRecord) == 64, "FalconRecord is ABI: one 64-byte cache line");
static_assert(sizeof(FalconCommEntry) == 192, "FalconCommEntry is ABI: 192 bytes");
static_assert(sizeof(FalconThreadSlot) == 64, "FalconThreadSlot is ABI: 64 bytes");
static_assert(sizeof(FalconLane) == 64, "FalconLane is ABI: 64 bytes");
static_assert(sizeof(FalconTask) == 64, "FalconTask is ABI: 64 bytes");
static_assert(sizeof(FalconTaskResult) == 64, "FalconTaskResult is ABI: 64 bytes");
static_assert(sizeof(FalconControl) % 64 == 0, "FalconControl keeps 64-byte alignment");
static_assert(sizeof(FalconPlanBlock) == 128 + 4 * (FALCON_PLAN_MAX_MICRO_BATCHES + FALCON_PLAN_MAX_PLACEMENT +
                                                     FALCON_PLAN_MAX_EXCLUDE + FALCON_PLAN_MAX_STAGES),
              "FalconPlanBlock is ABI: two 64-byte lines of words, then the arrays");
static_assert(sizeof(FalconPlanBlock) % 64 == 0, "FalconPlanBlock keeps 64-byte alignment");
static_assert(offsetof(FalconPlanBlock, ack_last) == 64, "the shim's ack words have their own cache line");
static_assert(offsetof(FalconPlanBlock, cost_us) == 88, "the cost words follow the ack words (ABI 4, once reserved)");
static_assert(offsetof(FalconPlanBlock, micro_batches) == 128, "the plan arrays start on a cache line");
static_assert(offsetof(FalconShmHeader, plan_offset) % 8 == 0, "plan_offset is naturally aligned");
static_assert(offsetof(FalconShmHeader, pid_ns) % 8 == 0, "pid_ns is naturally aligned");
static_assert(offsetof(FalconShmHeader, reserved) + 216 == sizeof(FalconShmHeader),
              "ABI 5 took pid_ns and boot_id, ABI 8 untracked_calls from the reserved tail: the header kept its size");
static_assert(offsetof(FalconShmHeader, untracked_calls) % 8 == 0, "untracked_calls is naturally aligned");
static_assert(offsetof(FalconRecord, version) == 0, "version leads the record");
static_assert(offsetof(FalconShmHeader, magic) == 0, "magic leads the header");
static_assert(sizeof(FalconShmHeader) % 64 == 0, "header keeps 64-byte alignment");
#endif

#endif /* FALCON_SHM_ABI_H_ */
