"""PyTorch Lightning adapter: `Trainer(callbacks=[falcon.lightning.FalconCallback()])`.

At every training batch start the callback runs falcon.torch.PlanHook.at_boundary (rank 0 polls,
every rank switches at the same step); checkpoints and validation loops run inside
falcon.phase("checkpoint") / falcon.phase("eval"), so the detector ignores them. Applying a
plan is the LightningModule's business: pass `apply(plan) -> bool` (for example, change the
number of gradient-accumulation micro-batches of this DP replica for S2); without one, S2 and S1
are recorded on the hook (hook.micro_batches, hook.gradient_weight) for the module to read.
Requires pytorch_lightning or lightning; importing this module without either raises ImportError.
"""
import falcon

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback

__all__ = ["FalconCallback"]


class FalconCallback(Callback):
    def __init__(self, apply=None, every=10, micro_batches=1):
        super().__init__()
        self._apply, self._every, self._mb = apply, every, micro_batches
        self.hook = None
        self._phases = []

    def setup(self, trainer, pl_module, stage=None):
        import falcon.torch as ft
        dp_rank = getattr(trainer, "global_rank", 0)
        self.hook = ft.PlanHook(dp_rank=dp_rank, micro_batches=self._mb, apply=self._apply, every=self._every)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.hook is not None:
            self.hook.at_boundary(trainer.global_step)

    def _enter(self, name):
        cm = falcon.phase(name)
        cm.__enter__()
        self._phases.append(cm)

    def _leave(self):
        if self._phases:
            self._phases.pop().__exit__(None, None, None)

    def on_validation_start(self, trainer, pl_module):
        self._enter("eval")

    def on_validation_end(self, trainer, pl_module):
        self._leave()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        # Lightning calls this before writing; the write itself follows synchronously. The phase
        # ends at the next batch start (below) or at the end of training.
        self._enter("checkpoint")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        while self._phases:
            self._leave()

    def on_train_end(self, trainer, pl_module):
        while self._phases:
            self._leave()
