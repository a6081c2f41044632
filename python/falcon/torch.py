"""Falcon's hook for torch.distributed jobs: every rank switches to a new mitigation plan at the
same iteration, applies it, acknowledges it and reports what it cost.

    hook = falcon.torch.PlanHook(dp_rank=dp_rank, micro_batches=8, apply=my_apply)
    for it in range(iters):
        hook.at_boundary(it)        # every `every` iterations: rank 0 polls, all ranks agree
        train_step(hook.micro_batches)

How ranks agree: rank `src` reads the plan from its shim and broadcasts it over a control group
(by default a gloo group made once, so that the job's NCCL communicators and its call pattern are
untouched); every rank then applies the same plan at the same iteration and acks it to its own
shim. The first boundary after a plan was applied measures what applying it cost (the
iteration's excess over the median of the iterations before it) and reports it
(falcon.report_cost), so that the controller's ski-rental rule uses measured costs.

Built-in application of S2 when `apply` is not given: `micro_batches` becomes this replica's
count, and `gradient_weight` (count / mean count) is what to scale this replica's gradient by
so that the loss stays unbiased; S1 restores the framework's own count. Other strategies need an
`apply(plan) -> bool` of the framework's own (returning False rejects the plan).

Thread-safety: call at_boundary from the training thread only.
"""
import statistics
import time

import torch
import torch.distributed as dist

import falcon

__all__ = ["PlanHook", "rebalance"]


def rebalance(global_micro_batches, counts, dp_rank):
    """S2 on a global batch: (this replica's micro-batches, its gradient weight). The weight is
    count / mean(counts), so that the DP average of weighted gradients is the full-batch mean."""
    if not counts:
        return global_micro_batches, 1.0
    mine = int(counts[dp_rank])
    mean = sum(counts) / len(counts)
    return mine, (mine / mean if mean > 0 else 1.0)


class PlanHook:
    def __init__(self, dp_rank=0, micro_batches=1, apply=None, every=10, src=0, group=None,
                 dp_group=None, report_costs=True):
        """dp_rank: this rank's rank in its data-parallel group (the index of S2's counts).
        micro_batches: the framework's own count per replica. apply(plan) -> bool: applies any
        strategy (default: S2/S1 as above). every: poll period in iterations. group: the control
        group (default: a gloo group over the world, made here, collectively on every rank).
        dp_group is accepted for symmetry with Megatron's hooks and unused."""
        self.dp_rank = dp_rank
        self.default_micro_batches = micro_batches
        self.micro_batches = micro_batches
        self.gradient_weight = 1.0
        self.user_apply = apply
        self.every = max(1, int(every))
        self.src = src
        self.enabled = falcon.available() and dist.is_available() and dist.is_initialized()
        self.group = group
        if self.enabled and self.group is None:
            self.group = dist.new_group(backend="gloo")  # collective: every rank makes it
        self.version = 0
        self.report_costs = report_costs
        self._iter_times = []
        self._last_t = None
        self._pending_cost = None  # (strategy, median before) while the first iteration runs
        self.applied = []          # (iteration, version, strategy, ok)

    def _poll_src(self):
        try:
            p = falcon.plan()
        except falcon.PlanBusy:
            return None
        return p if p is not None and p.version > self.version else None

    def at_boundary(self, iteration):
        """Call at the start of every iteration; returns the plan applied now, or None."""
        now = time.perf_counter()
        if self._last_t is not None:
            dt = now - self._last_t
            if self._pending_cost is not None:
                strategy, before = self._pending_cost
                self._pending_cost = None
                if self.report_costs and before is not None:
                    try:
                        falcon.report_cost(strategy, max(0.0, dt - before))
                    except falcon.FalconError:
                        pass  # a cost the shim refuses is not worth stopping training for
            else:
                self._iter_times = (self._iter_times + [dt])[-50:]
        self._last_t = now
        if not self.enabled or iteration % self.every != 0:
            return None
        obj = [self._poll_src() if dist.get_rank() == self.src else None]
        dist.broadcast_object_list(obj, src=self.src, group=self.group)
        plan = obj[0]
        if plan is None or plan.version <= self.version:
            return None
        ok = bool(self._apply(plan))
        self.version = plan.version
        self.applied.append((iteration, plan.version, plan.strategy, ok))
        try:
            falcon.ack(plan.version, ok=ok)
        except falcon.FalconError:
            pass
        if ok and plan.strategy in ("S2", "S3", "S4", "pipeline"):
            before = statistics.median(self._iter_times) if self._iter_times else None
            self._pending_cost = (plan.strategy, before)
        self._last_t = time.perf_counter()  # the application itself counts towards the next one
        return plan

    def _apply(self, plan):
        if self.user_apply is not None:
            return self.user_apply(plan)
        if plan.strategy == "S2" and plan.micro_batches:
            if self.dp_rank >= len(plan.micro_batches):
                return False
            self.micro_batches, self.gradient_weight = rebalance(
                self.default_micro_batches, plan.micro_batches, self.dp_rank)
            return True
        if plan.strategy == "S1":
            self.micro_batches, self.gradient_weight = self.default_micro_batches, 1.0
            return True
        return False  # S3 / S4 / pipeline need the framework's own apply
