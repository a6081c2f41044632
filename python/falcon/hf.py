"""Hugging Face Transformers adapter: `Trainer(..., callbacks=[falcon.hf.FalconTrainerCallback()])`.

At every step begin it runs falcon.torch.PlanHook.at_boundary; evaluation and checkpoint saves
run inside falcon.phase("eval") / falcon.phase("checkpoint"). S2 changes this replica's
gradient-accumulation steps (args.gradient_accumulation_steps) when `apply_s2=True` and the plan
names this replica; other strategies need `apply(plan) -> bool`. Requires transformers.
"""
import falcon

from transformers import TrainerCallback

__all__ = ["FalconTrainerCallback"]


class FalconTrainerCallback(TrainerCallback):
    def __init__(self, apply=None, every=10, apply_s2=True):
        self._apply, self._every, self._apply_s2 = apply, every, apply_s2
        self.hook = None
        self._args = None
        self._phase = None

    def on_train_begin(self, args, state, control, **kwargs):
        import torch.distributed as dist
        import falcon.torch as ft
        self._args = args
        dp_rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.hook = ft.PlanHook(dp_rank=dp_rank, micro_batches=args.gradient_accumulation_steps,
                                apply=self._apply or self._default_apply, every=self._every)

    def _default_apply(self, plan):
        if not self._apply_s2:
            return False
        if plan.strategy == "S2" and plan.micro_batches and self.hook.dp_rank < len(plan.micro_batches):
            self._args.gradient_accumulation_steps = int(plan.micro_batches[self.hook.dp_rank])
            return True
        if plan.strategy == "S1":
            self._args.gradient_accumulation_steps = self.hook.default_micro_batches
            return True
        return False

    def on_step_begin(self, args, state, control, **kwargs):
        self._end_phase()
        if self.hook is not None:
            self.hook.at_boundary(state.global_step)

    def _begin_phase(self, name):
        self._end_phase()
        self._phase = falcon.phase(name)
        self._phase.__enter__()

    def _end_phase(self):
        if self._phase is not None:
            self._phase.__exit__(None, None, None)
            self._phase = None

    def on_evaluate(self, args, state, control, **kwargs):
        self._end_phase()

    def on_prediction_step(self, args, state, control, **kwargs):
        if self._phase is None:
            self._begin_phase("eval")

    def on_save(self, args, state, control, **kwargs):
        self._end_phase()

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save:
            self._begin_phase("checkpoint")  # the save follows this callback

    def on_train_end(self, args, state, control, **kwargs):
        self._end_phase()
