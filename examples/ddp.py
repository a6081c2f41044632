#!/usr/bin/env python3
"""Plain DistributedDataParallel with Falcon's hook: the smallest real job that uses it.

Each rank trains a small MLP on synthetic data with gradient accumulation over
--micro-batches micro-batches. falcon.torch.PlanHook gives each DP replica its share of the
global batch when the controller re-balances micro-batches (S2), and the loss is weighted so
that the gradient stays the full-batch mean; checkpoints run inside falcon.phase("checkpoint").
Without the shim (or the package) it is plain DDP.

  torchrun --nproc-per-node 4 examples/ddp.py --iters 200
  FALCON_JOB=ddp1 LD_PRELOAD=/opt/falcon/lib/libfalcon_shim.so torchrun --nproc-per-node 4 examples/ddp.py
"""
import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import falcon
    import falcon.torch as falcon_torch
except ImportError:
    falcon = None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32, help="samples per micro-batch")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--checkpoint-dir", default="/tmp")
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Sequential(torch.nn.Linear(a.hidden, 4 * a.hidden), torch.nn.GELU(),
                                torch.nn.Linear(4 * a.hidden, a.hidden)).to(device)
    ddp = DDP(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    hook = falcon_torch.PlanHook(dp_rank=rank, micro_batches=a.micro_batches) if falcon and falcon.available() else None
    g = torch.Generator().manual_seed(rank)
    for it in range(a.iters):
        if hook is not None:
            hook.at_boundary(it)
        m = hook.micro_batches if hook else a.micro_batches
        weight = hook.gradient_weight if hook else 1.0
        t0 = time.time()
        opt.zero_grad(set_to_none=True)
        for mb in range(m):
            x = torch.randn(a.batch, a.hidden, generator=g).to(device)
            ctx = ddp.no_sync() if mb < m - 1 else contextlib.nullcontext()  # all-reduce on the last
            with ctx:
                loss = (ddp(x) - x).pow(2).mean() * weight / m
                loss.backward()
        opt.step()
        loss_v = loss.item() * m / weight
        if rank == 0 and it % 10 == 0:
            print(f"iter {it} {1e3 * (time.time() - t0):.1f} ms loss {loss_v:.4f} micro-batches {m}", flush=True)
        if a.checkpoint_every and (it + 1) % a.checkpoint_every == 0:
            phase = falcon.phase("checkpoint") if falcon else contextlib.nullcontext()
            with phase:
                torch.save(model.state_dict(), os.path.join(a.checkpoint_dir, f"ddp.rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
