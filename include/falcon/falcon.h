/* Falcon's C API for training frameworks: read the mitigation plan in force and acknowledge it,
 * without Redis. Exported by libfalcon_shim.so (LD_PRELOAD); a framework hook that may run
 * without the shim resolves the functions with dlsym(RTLD_DEFAULT, "falconGetPlan") and treats a
 * missing symbol as "no Falcon".
 *
 * Where the plan comes from: in act mode the controller sends a plan command to every agent; the
 * agent writes it into each traced process's shared-memory plan block (FalconPlanBlock in
 * shm_abi.h), also into processes that start later; these functions read it from there. In
 * advise mode nothing arrives here (plans are published on Redis only: falcon-ctl plan).
 * The shim's segment exists from the process's first NCCL call on; before it (and when the
 * shim passes calls through) there is no plan. Capacities: FALCON_PLAN_MAX_MICRO_BATCHES (4096)
 * micro-batch counts, FALCON_PLAN_MAX_PLACEMENT (16384) placement entries,
 * FALCON_PLAN_MAX_EXCLUDE (1024) excluded nodes, FALCON_PLAN_MAX_STAGES (1024) pipeline stages;
 * the agent refuses larger plans whole.
 *
 * The plan (one at a time; a newer version replaces an older one):
 *   - version: increases with every decision of the job; 0 = no plan has arrived.
 *   - strategy: FalconStrategy. S1 after S2 means "undo the re-balancing": go back to the
 *     framework's own micro-batch counts.
 *   - micro-batch counts (S2), one per data-parallel replica, indexed by the rank's rank in its
 *     data-parallel communicator; the counts sum to the job's global micro-batch count. Keep the
 *     loss unbiased by weighting replica i's gradient by counts[i] / sum(counts).
 *   - placement (S3, S4): the node index of every global rank after re-placement. An S3 may
 *     carry micro-batch counts too (a slow GPU and a slow link at once): apply both.
 *   - S4 also names nodes to leave out and asks for a restart from the last checkpoint.
 *   - pipeline (adapt the pipeline, for a slow link between pipeline stages): warm-up forward
 *     counts per pipeline stage, indexed by the stage (a rank's rank in its pipeline
 *     communicator). Entry s is what Megatron-LM calls stage s's num_warmup_microbatches: the
 *     forwards it runs before its first backward, less one (1F1B: stages - s - 1; the last stage
 *     0). Counts never increase along the pipeline; a larger difference between neighbours lets
 *     the link between them run late without idling the stages behind it, at the cost of
 *     activation memory (count + 1 micro-batches held). S1 after it means "back to 1F1B".
 * Apply a plan at an iteration boundary on which every rank agrees (e.g. rank 0 polls and
 * broadcasts), then call falconAckPlan on every rank.
 *
 * Thread-safety: every function may be called from any thread at any time, also before the
 * first NCCL call (then there is no plan yet). None blocks, allocates, or makes a syscall; each
 * costs well under a microsecond. Reads are consistent: a plan is never seen half-written. */
#ifndef FALCON_FALCON_H_
#define FALCON_FALCON_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FALCON_API_VERSION 4 /* 2: falconReportCost; 3: falconSetPhase, falconGetPhase;
                                4: kFalconStrategyPipeline, falconGetPipelinePlan */

/* Return codes (negative = no data was written). */
#define FALCON_OK 0
#define FALCON_ERR_NO_PLAN (-1)   /* no plan has arrived (or the shim is passing through) */
#define FALCON_ERR_INVALID (-2)   /* a NULL pointer where one is needed, or a bad argument */
#define FALCON_ERR_BUSY (-3)      /* the plan kept changing while being read; try again later */

typedef enum {
  kFalconStrategyNone = 0,
  kFalconStrategyIgnore = 1,     /* S1 (after S2: undo the re-balancing) */
  kFalconStrategyRebalance = 2,  /* S2 re-distribute micro-batches across DP replicas */
  kFalconStrategyTopology = 3,   /* S3 re-place ranks on nodes */
  kFalconStrategyRestart = 4,    /* S4 checkpoint and restart without the excluded nodes */
  kFalconStrategyPipeline = 5    /* adapt the pipeline: new warm-up counts per stage (API 4) */
} FalconStrategy;

/* What the job is doing, as the framework annotates it. Anything but training is a planned
 * pause: the agent leaves iterations that overlap it out of fail-slow detection, and a rank in
 * one is not hung for being silent. */
typedef enum {
  kFalconPhaseTrain = 0,      /* the default */
  kFalconPhaseCheckpoint = 1, /* saving or loading a checkpoint */
  kFalconPhaseEval = 2,       /* evaluation / validation loop */
  kFalconPhaseDataload = 3,   /* waiting for data (a slow loader is the job's, not a GPU's) */
  kFalconPhaseOther = 4       /* any other planned pause */
} FalconPhase;

typedef struct FalconPlanInfo {
  uint32_t version;           /* 0 = no plan */
  uint32_t strategy;          /* FalconStrategy */
  uint32_t micro_batch_count; /* entries of the micro-batch plan (0: none) */
  uint32_t placement_count;   /* entries of the placement plan (0: none) */
  uint32_t exclude_count;     /* nodes to leave out (S4) */
  uint32_t restart;           /* 1: restart from the last checkpoint (S4) */
  int64_t issued_real_ns;     /* when the agent delivered it, CLOCK_REALTIME ns */
} FalconPlanInfo;

/* The API version this library implements (FALCON_API_VERSION). */
int falconApiVersion(void);

/* The version of the plan in force, 0 when there is none. */
uint32_t falconPlanVersion(void);

/* Fills *info. FALCON_OK, FALCON_ERR_NO_PLAN (info->version = 0), FALCON_ERR_INVALID, or
 * FALCON_ERR_BUSY. */
int falconGetPlan(FalconPlanInfo* info);

/* Copies the micro-batch plan: up to `capacity` counts to `counts`, the plan's version to
 * *version (may be NULL). Returns the plan's number of entries (may exceed capacity: then only
 * `capacity` were copied), 0 when the plan in force has no micro-batch part, or an error.
 * `counts` may be NULL when capacity is 0 (asks for the size only); capacity < 0, or NULL with
 * capacity > 0, is FALCON_ERR_INVALID. On any error *version is 0. The count, the entries and
 * the version come from one consistent snapshot of the plan. */
int falconGetMicroBatchPlan(int32_t* counts, int capacity, uint32_t* version);

/* The same for the placement plan (node index of every global rank). */
int falconGetPlacementPlan(int32_t* node_of_rank, int capacity, uint32_t* version);

/* The same for the nodes an S4 restart leaves out. */
int falconGetExcludedNodes(int32_t* nodes, int capacity, uint32_t* version);

/* The same for the pipeline plan: warm-up forward counts per pipeline stage (see above). The
 * count is not in FalconPlanInfo (its layout is fixed): ask with capacity 0. (API version 4.) */
int falconGetPipelinePlan(int32_t* warmup, int capacity, uint32_t* version);

/* This rank applied (status 0) or rejected (status != 0) plan `version`; the agent reports it to
 * the controller (rank_register plan_applied / plan_rejected: the highest version acked with
 * status 0 / with another status). FALCON_OK, FALCON_ERR_INVALID for version 0, or
 * FALCON_ERR_NO_PLAN when no shared memory is attached. */
int falconAckPlan(uint32_t version, int status);

/* What applying a strategy costs this rank, measured by the framework: `seconds` of training
 * lost, >= 0 and finite (at most 49 days). For kFalconStrategyRebalance, the time from the plan's
 * arrival to the first iteration on the new counts beyond a normal iteration; for
 * kFalconStrategyTopology, the stop, state move and communicator rebuild; for
 * kFalconStrategyRestart, checkpoint save (or the work since the last checkpoint that a restart
 * loses) + relaunch + load + warm-up: a framework may report this from its own checkpoint
 * history before any restart is planned; for kFalconStrategyPipeline (API version 4), the switch
 * to the new warm-up counts. Call it after applying a plan, after a checkpoint, or
 * whenever the figure changes; the latest report per strategy counts. The agent reports it to
 * the controller (rank_register cost_s2 / cost_s3 / cost_s4 / cost_s5), whose ski-rental rule then uses
 * the slowest rank's figure instead of the configured overhead (falcon-controller s2-overhead-s
 * etc.) for its next decisions. FALCON_OK, FALCON_ERR_INVALID for another strategy or a
 * negative, NaN or too large `seconds`, or FALCON_ERR_NO_PLAN when no shared memory is attached.
 * (API version 2.) */
int falconReportCost(uint32_t strategy, double seconds);

/* The process enters `phase` (FalconPhase) now; kFalconPhaseTrain when it is over. Recorded in
 * the call log at this point in time (an annotation record) and in the control block, so the
 * agent sees when each phase began and ended. Callable before the first NCCL call (the phase is
 * kept and written once the shim has its segment) and from any thread; the last call wins.
 * FALCON_OK, or FALCON_ERR_INVALID for an unknown phase. (API version 3.) */
int falconSetPhase(uint32_t phase);

/* The phase the process is in (FalconPhase), kFalconPhaseTrain if none was set. (API 3.) */
int falconGetPhase(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FALCON_FALCON_H_ */
