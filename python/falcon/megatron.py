"""Megatron-LM hook: the lines a Megatron user adds to `pretrain()`'s training loop.

    from falcon.megatron import MegatronHook
    hook = MegatronHook()                       # after initialize_megatron()
    ...
    while iteration < args.train_iters:
        hook.at_boundary(iteration)             # before train_step
        ...                                     # train_step uses hook.num_microbatches()
        if should_checkpoint:
            with falcon.phase("checkpoint"):
                save_checkpoint(...)

What it applies:
  - S2: this DP replica's number of micro-batches (get_num_microbatches() is global in Megatron;
    pass hook.num_microbatches() to the forward-backward function instead) and the gradient
    weight count / mean that keeps the loss unbiased (scale the loss by hook.gradient_weight);
  - pipeline adaptation: per-stage warm-up counts (hook.warmup_for_stage(stage)), used by a
    1F1B schedule in place of pipeline_model_parallel_size - stage - 1;
  - S1 undoes both. S3 / S4 need the launcher (re-placement / restart): pass apply=.
DP rank and size come from megatron.core.parallel_state when importable, else from the
arguments. Requires torch; megatron.core is optional.
"""
import falcon
import falcon.torch as ft

__all__ = ["MegatronHook"]


class MegatronHook:
    def __init__(self, num_microbatches=None, dp_rank=None, pp_rank=None, apply=None, every=10):
        try:
            from megatron.core import parallel_state as ps
            dp_rank = ps.get_data_parallel_rank() if dp_rank is None else dp_rank
            pp_rank = ps.get_pipeline_model_parallel_rank() if pp_rank is None else pp_rank
            if num_microbatches is None:
                from megatron.core.num_microbatches_calculator import get_num_microbatches
                num_microbatches = get_num_microbatches()
        except ImportError:
            pass
        self.dp_rank = dp_rank or 0
        self.pp_rank = pp_rank or 0
        self.default_microbatches = num_microbatches or 1
        self._user_apply = apply
        self.warmup = ()
        self.hook = ft.PlanHook(dp_rank=self.dp_rank, micro_batches=self.default_microbatches,
                                apply=self._apply, every=every)

    def _apply(self, plan):
        if self._user_apply is not None and plan.strategy in ("S3", "S4"):
            return self._user_apply(plan)
        if plan.strategy == "S2":
            if not plan.micro_batches or self.dp_rank >= len(plan.micro_batches):
                return False
            self.hook.micro_batches, self.hook.gradient_weight = ft.rebalance(
                self.default_microbatches, plan.micro_batches, self.dp_rank)
            return True
        if plan.strategy == "pipeline":
            if not plan.warmup or self.pp_rank >= len(plan.warmup):
                return False
            self.warmup = tuple(plan.warmup)
            return True
        if plan.strategy == "S1":
            self.hook.micro_batches, self.hook.gradient_weight = self.default_microbatches, 1.0
            self.warmup = ()
            return True
        return self._user_apply(plan) if self._user_apply is not None else False

    def at_boundary(self, iteration):
        return self.hook.at_boundary(iteration)

    def num_microbatches(self):
        return self.hook.micro_batches

    @property
    def gradient_weight(self):
        return self.hook.gradient_weight

    def warmup_for_stage(self, stage, pipeline_size):
        """The warm-up forward count of `stage`: the plan's, else 1F1B's pipeline_size - stage - 1."""
        if self.warmup and stage < len(self.warmup):
            return int(self.warmup[stage])
        return pipeline_size - stage - 1
