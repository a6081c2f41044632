#!/usr/bin/env python3
"""A small hybrid-parallel (TP x DP x PP) transformer-MLP job in plain PyTorch, built the way
Megatron-LM builds its parallelism, with Falcon's Python hook. Also the GPU kit's workload.

What it does, as Megatron does it:
  - process groups: every rank creates every group in Megatron's order (data-parallel,
    model-parallel, tensor-parallel, pipeline, embedding), rank = pp*(dp*tp) + dp*tp + tp;
  - tensor parallel: each layer is a column-parallel then a row-parallel linear, with an
    all-reduce on the TP group in the forward (row-parallel output) and in the backward
    (column-parallel input gradient);
  - pipeline parallel: a 1F1B schedule over --micro-batches, activations and gradients sent with
    batch_isend_irecv (grouped send/recv) between neighbouring stages;
  - data parallel: gradients all-reduced on the DP group in buckets after the backward; the loss
    averaged on the DP group, the gradient norm all-reduced on the model-parallel group;
  - no collective over the whole world per iteration.

Falcon (optional, when the `falcon` package is importable and the shim is preloaded): each
iteration boundary polls the mitigation plan (falcon.torch.PlanHook: rank 0 polls, every rank
switches at the same iteration, S2 re-splits the micro-batches of this DP replica), checkpoints
run inside falcon.phase("checkpoint").

Fault injection for tests: --slow-rank R --slow-after-s S makes rank R slow from S seconds on:
--slow-factor F computes every layer F times (extra matrix products, as a throttled GPU takes
longer), --slow-ms M keeps its device busy M ms more per micro-batch forward (a spin kernel: the
same extra device time whatever the model's size). Hangs: --inject-stall R:S makes rank R stop
issuing NCCL calls before its first iteration after S seconds (a host stuck in Python or a data
loader; every other rank then waits in NCCL); --inject-mismatch R:S:count|dtype makes rank R
all-reduce its loss of that iteration with another count (2 elements) or datatype (fp64) on the
data-parallel group (DP > 1), as a bug in one rank's code would. Each
prints "rank R: --inject-...: ... (from <unix ns> ns)" when it strikes.

  torchrun --nproc-per-node 8 examples/megatron_style.py --tp 2 --pp 2 --dp 2 --iters 100
  (several ranks on one GPU: give each process its own NCCL_HOSTID, see scripts/gpu_check.sh)
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

try:  # Falcon's package: python/ on PYTHONPATH, or `pip install ./python`
    import falcon
    import falcon.torch as falcon_torch
except ImportError:
    falcon = None


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="TP x DP x PP MLP job, Megatron-style groups and 1F1B")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--dp", type=int, default=0, help="data-parallel size (default: world / (tp*pp))")
    ap.add_argument("--iters", type=int, default=100, help="iterations (0: run until --duration-s)")
    ap.add_argument("--duration-s", type=float, default=0, help="stop after this long (0: --iters decides)")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2, help="layers per pipeline stage")
    ap.add_argument("--micro-batches", type=int, default=4, help="micro-batches per iteration per DP replica")
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--bucket-mb", type=float, default=4.0, help="DP gradient bucket size, MiB")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    ap.add_argument("--checkpoint-every", type=int, default=0, help="save a checkpoint every N iterations (0: never)")
    ap.add_argument("--checkpoint-dir", default="/tmp")
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-after-s", type=float, default=0)
    ap.add_argument("--slow-factor", type=float, default=1.0, help="the slow rank computes each layer this many times")
    ap.add_argument("--slow-ms", type=float, default=0.0,
                    help="the slow rank's device also stays busy this long per micro-batch forward (a spin kernel)")
    ap.add_argument("--inject-stall", default="", metavar="RANK:SECONDS",
                    help="rank RANK stops issuing NCCL calls before its first iteration after SECONDS")
    ap.add_argument("--inject-mismatch", default="", metavar="RANK:SECONDS:count|dtype",
                    help="rank RANK all-reduces its loss with another count or datatype, once, after SECONDS")
    ap.add_argument("--report", default="", help="write this rank's iteration times to REPORT.rank<R> (JSON)")
    ap.add_argument("--no-falcon", action="store_true", help="do not use the falcon package even if importable")
    ap.add_argument("--progress-every", type=int, default=0)
    a = ap.parse_args(argv)
    a.stall = parse_injection(ap, "--inject-stall", a.inject_stall, None)
    a.mismatch = parse_injection(ap, "--inject-mismatch", a.inject_mismatch, ("count", "dtype"))
    return a


def parse_injection(ap, option, value, kinds):
    """RANK:SECONDS[:KIND] -> (rank, seconds, kind) or None when not given."""
    if not value:
        return None
    f = value.split(":")
    try:
        if len(f) != (3 if kinds else 2):
            raise ValueError
        rank, seconds = int(f[0]), float(f[1])
        if rank < 0 or not 0 <= seconds < 1e6:
            raise ValueError
    except ValueError:
        ap.error(f"{option} {value!r}: expected RANK:SECONDS" + (":" + "|".join(kinds) if kinds else ""))
    if kinds and f[2] not in kinds:
        ap.error(f"{option} {value!r}: the kind must be one of {', '.join(kinds)}")
    return rank, seconds, f[2] if kinds else None


def announce(rank, option, what):
    print(f"rank {rank}: {option}: {what} (from {time.time_ns()} ns)", flush=True)


class Layout:
    """Megatron's rank order: tp fastest, then dp, then pp."""

    def __init__(self, world, tp, pp, dp):
        if dp == 0:
            dp = world // (tp * pp)
        if tp * pp * dp != world:
            raise SystemExit(f"tp {tp} x pp {pp} x dp {dp} != world size {world}")
        self.world, self.tp, self.pp, self.dp = world, tp, pp, dp

    def coords(self, rank):
        return rank // (self.dp * self.tp), (rank // self.tp) % self.dp, rank % self.tp  # pp, dp, tp

    def rank(self, pp, dp, tp):
        return pp * self.dp * self.tp + dp * self.tp + tp


def build_groups(lay, rank, backend_opts=None):
    """Every rank creates every group, in Megatron's order; returns this rank's."""
    mine = {}
    pp_i, dp_i, tp_i = lay.coords(rank)
    for p in range(lay.pp):  # data-parallel
        for t in range(lay.tp):
            ranks = [lay.rank(p, d, t) for d in range(lay.dp)]
            g = dist.new_group(ranks)
            if rank in ranks:
                mine["dp"] = (g, ranks)
    for d in range(lay.dp):  # model-parallel (tp x pp of one replica)
        ranks = [lay.rank(p, d, t) for p in range(lay.pp) for t in range(lay.tp)]
        g = dist.new_group(ranks)
        if rank in ranks:
            mine["mp"] = (g, ranks)
    for p in range(lay.pp):  # tensor-parallel
        for d in range(lay.dp):
            ranks = [lay.rank(p, d, t) for t in range(lay.tp)]
            g = dist.new_group(ranks)
            if rank in ranks:
                mine["tp"] = (g, ranks)
    for d in range(lay.dp):  # pipeline
        for t in range(lay.tp):
            ranks = [lay.rank(p, d, t) for p in range(lay.pp)]
            g = dist.new_group(ranks)
            if rank in ranks:
                mine["pp"] = (g, ranks)
            emb = sorted({ranks[0], ranks[-1]})  # embedding group: first and last stage
            g = dist.new_group(emb)
            if rank in emb:
                mine["emb"] = (g, emb)
    return mine


class _ReduceFromTP(torch.autograd.Function):
    """Row-parallel output: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class _CopyToTP(torch.autograd.Function):
    """Column-parallel input: identity forward, all-reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class Stage(torch.nn.Module):
    def __init__(self, hidden, layers, tp, tp_group, dtype, device):
        super().__init__()
        self.tp_group = tp_group if tp > 1 else None
        ff = 4 * hidden // tp
        self.w1 = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(hidden, ff, device=device, dtype=dtype) * hidden ** -0.5) for _ in range(layers)])
        self.w2 = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(ff, hidden, device=device, dtype=dtype) * ff ** -0.5) for _ in range(layers)])
        self.extra = 0.0  # extra compute factor (fault injection)
        self.busy_ms = 0.0  # extra device time per forward (fault injection)
        self.cycles_per_ms = 0.0

    def forward(self, x):
        for w1, w2 in zip(self.w1, self.w2):
            h = _CopyToTP.apply(x, self.tp_group) if self.tp_group else x
            y = torch.nn.functional.gelu(h @ w1) @ w2
            if self.extra > 0:  # a throttled GPU: the same products again, results unused
                with torch.no_grad():
                    reps = int(self.extra)
                    for _ in range(reps):
                        torch.nn.functional.gelu(h @ w1) @ w2
            x = x + (_ReduceFromTP.apply(y, self.tp_group) if self.tp_group else y)
        if self.busy_ms > 0:
            if x.is_cuda and self.cycles_per_ms > 0:
                torch.cuda._sleep(int(self.busy_ms * self.cycles_per_ms))
            else:
                time.sleep(self.busy_ms / 1e3)
        return x


class Trainer:
    def __init__(self, args, rank, world, device):
        self.a, self.rank, self.dev = args, rank, device
        self.lay = Layout(world, args.tp, args.pp, args.dp)
        self.pp_i, self.dp_i, self.tp_i = self.lay.coords(rank)
        self.groups = build_groups(self.lay, rank)
        self.dtype = torch.bfloat16 if args.dtype == "bf16" and device.type == "cuda" else torch.float32
        torch.manual_seed(1234 + self.pp_i * 100 + self.tp_i)  # same weights across DP replicas
        self.model = Stage(args.hidden, args.layers, args.tp, self.groups.get("tp", (None,))[0], self.dtype, device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        self.micro_batches = args.micro_batches
        pp_ranks = self.groups["pp"][1]
        self.prev = pp_ranks[self.pp_i - 1] if self.pp_i > 0 else None
        self.next = pp_ranks[self.pp_i + 1] if self.pp_i + 1 < len(pp_ranks) else None
        self.shape = (args.micro_batch_size, args.seq, args.hidden)
        self.hook = None
        if falcon is not None and not args.no_falcon and falcon.available():
            self.hook = falcon_torch.PlanHook(dp_group=self.groups["dp"][0], dp_rank=self.dp_i,
                                              micro_batches=args.micro_batches, apply=self.apply_plan)

    def apply_plan(self, plan):
        counts = plan.micro_batches
        if counts and self.dp_i < len(counts):
            self.micro_batches = int(counts[self.dp_i])
        return True

    # -- pipeline communication (Megatron's p2p_communication: batch_isend_irecv) --
    def exchange(self, send_next=None, recv_prev=False, send_prev=None, recv_next=False):
        ops, got_prev, got_next = [], None, None
        if send_next is not None and self.next is not None:
            ops.append(dist.P2POp(dist.isend, send_next.contiguous(), self.next))
        if recv_prev and self.prev is not None:
            got_prev = torch.empty(self.shape, device=self.dev, dtype=self.dtype)
            ops.append(dist.P2POp(dist.irecv, got_prev, self.prev))
        if send_prev is not None and self.prev is not None:
            ops.append(dist.P2POp(dist.isend, send_prev.contiguous(), self.prev))
        if recv_next and self.next is not None:
            got_next = torch.empty(self.shape, device=self.dev, dtype=self.dtype)
            ops.append(dist.P2POp(dist.irecv, got_next, self.next))
        if ops:
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        return got_prev, got_next

    def forward_step(self, inp, mb):
        if self.prev is None:
            g = torch.Generator(device="cpu").manual_seed(mb * 7919 + self.dp_i)
            inp = torch.randn(self.shape, generator=g).to(self.dev, self.dtype)
        inp = inp.detach().requires_grad_(self.prev is not None)
        out = self.model(inp)
        if self.next is None:
            loss = (out.float() ** 2).mean()
            return inp, out, loss
        return inp, out, None

    def backward_step(self, inp, out, loss, grad_out):
        if loss is not None:
            loss.backward()
        else:
            out.backward(grad_out)
        return inp.grad if inp.requires_grad else None

    def one_f_one_b(self):
        S, s, N = self.lay.pp, self.pp_i, self.micro_batches
        warm = min(S - s - 1, N)
        stash, losses = [], []
        fwd_mb = 0
        inp = None
        for _ in range(warm):
            inp, _ = self.exchange(recv_prev=True)
            i, o, l_ = self.forward_step(inp, fwd_mb)
            fwd_mb += 1
            self.exchange(send_next=o.detach())
            stash.append((i, o, l_))
        remaining = N - warm
        if remaining > 0:
            inp, _ = self.exchange(recv_prev=True)
        for k in range(remaining):
            i, o, l_ = self.forward_step(inp, fwd_mb)
            fwd_mb += 1
            if l_ is not None:
                losses.append(l_.detach())
            stash.append((i, o, l_))
            _, grad = self.exchange(send_next=o.detach(), recv_next=True)
            i0, o0, l0 = stash.pop(0)
            gi = self.backward_step(i0, o0, l0, grad)
            last = k == remaining - 1
            inp, _ = self.exchange(send_prev=gi, recv_prev=not last)
        for _ in range(warm):
            _, grad = self.exchange(recv_next=True)
            i0, o0, l0 = stash.pop(0)
            gi = self.backward_step(i0, o0, l0, grad)
            self.exchange(send_prev=gi)
        return losses

    def reduce_gradients(self):
        dp_group, dp_ranks = self.groups["dp"]
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if len(dp_ranks) > 1:
            bucket, size, limit = [], 0, int(self.a.bucket_mb * 2 ** 20)
            for g in reversed(grads):  # buckets in backward order, as DDP / Megatron fill them
                bucket.append(g)
                size += g.numel() * g.element_size()
                if size >= limit:
                    self._all_reduce_bucket(bucket, dp_group, len(dp_ranks))
                    bucket, size = [], 0
            if bucket:
                self._all_reduce_bucket(bucket, dp_group, len(dp_ranks))
        sq = torch.zeros(1, device=self.dev)
        for g in grads:
            sq += g.float().pow(2).sum()
        mp_group, mp_ranks = self.groups["mp"]
        if len(mp_ranks) > 1:
            dist.all_reduce(sq, group=mp_group)  # grad norm over the model-parallel group
        return sq

    @staticmethod
    def _all_reduce_bucket(bucket, group, n):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        flat.div_(n)
        dist.all_reduce(flat, group=group)
        off = 0
        for g in bucket:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()

    def iteration(self, it, mismatch=None):
        self.opt.zero_grad(set_to_none=True)
        losses = self.one_f_one_b()
        self.reduce_gradients()
        self.opt.step()
        loss = torch.stack(losses).mean() if losses else torch.zeros((), device=self.dev)
        loss = loss.float().reshape(1)
        dp_group, dp_ranks = self.groups["dp"]
        if mismatch:  # this rank's loss all-reduce disagrees with its peers' (count or datatype)
            loss = loss.repeat(2) if mismatch == "count" else loss.double()
            announce(self.rank, "--inject-mismatch", f"all-reduces its loss as {loss.numel()} x {loss.dtype} "
                     f"on ranks {dp_ranks} in iteration {it}")
        if len(dp_ranks) > 1:
            dist.all_reduce(loss, group=dp_group)  # averaged loss, as Megatron logs it
        return loss[0].item() / max(len(dp_ranks), 1)  # host synchronisation, as a logging step does

    def checkpoint(self, it):
        path = os.path.join(self.a.checkpoint_dir, f"megatron_style.rank{self.rank}.pt")
        ctx = falcon.phase("checkpoint") if falcon is not None and not self.a.no_falcon else _Null()
        with ctx:
            torch.save({k: v.detach().cpu() for k, v in self.model.state_dict().items()}, path)


def calibrate_spin(device):
    """Spin-kernel cycles per millisecond of device time on this GPU."""
    cycles = 10_000_000
    torch.cuda._sleep(cycles // 10)  # warm-up
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    torch.cuda._sleep(cycles)
    e1.record()
    e1.synchronize()
    return cycles / max(e0.elapsed_time(e1), 1e-3)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv=None):
    args = parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_DEVICE", os.environ.get("LOCAL_RANK", "0")))
                              % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    tr = Trainer(args, rank, world, device)
    for option, inj in (("--inject-stall", args.stall), ("--inject-mismatch", args.mismatch)):
        if inj and inj[0] >= world:
            raise SystemExit(f"{option}: rank {inj[0]} is not in this job of {world} ranks")
    if args.mismatch and tr.lay.dp < 2:
        raise SystemExit("--inject-mismatch needs data parallelism (--dp 2 or more): the loss all-reduce it changes")
    if rank == args.slow_rank and args.slow_ms > 0 and device.type == "cuda":
        tr.model.cycles_per_ms = calibrate_spin(device)
    times, t_start = [], time.time()
    it = 0
    while True:
        if args.iters and it >= args.iters:
            break
        if args.duration_s and time.time() - t_start >= args.duration_s:
            break  # every rank decides on its own clock; the next line keeps them together
        if tr.hook is not None:
            tr.hook.at_boundary(it)
        slow = rank == args.slow_rank and time.time() - t_start >= args.slow_after_s
        tr.model.extra = args.slow_factor - 1.0 if slow else 0.0
        tr.model.busy_ms = args.slow_ms if slow else 0.0
        if args.stall and rank == args.stall[0] and time.time() - t_start >= args.stall[1]:
            announce(rank, "--inject-stall", f"stops issuing NCCL calls before iteration {it}")
            while True:  # stuck on the host, as a hung data loader is; the others wait in NCCL
                time.sleep(1)
        mismatch = None
        if args.mismatch and rank == args.mismatch[0] and time.time() - t_start >= args.mismatch[1]:
            mismatch, args.mismatch = args.mismatch[2], None  # once
        t0 = time.time()
        loss = tr.iteration(it, mismatch)
        t1 = time.time()
        times.append({"iter": it, "start_s": t0 - t_start, "duration_s": t1 - t0, "slow": slow,
                      "micro_batches": tr.micro_batches, "loss": loss})
        if args.checkpoint_every and (it + 1) % args.checkpoint_every == 0:
            tr.checkpoint(it)
        if args.progress_every and rank == 0 and it % args.progress_every == 0:
            print(f"iter {it} {1e3 * (t1 - t0):.1f} ms loss {loss:.4f}", flush=True)
        it += 1
        if args.duration_s:  # agree on stopping: a rank that stops alone would hang the others
            flag = torch.tensor([1.0 if time.time() - t_start >= args.duration_s else 0.0], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=tr.groups["mp"][0]) if tr.lay.tp * tr.lay.pp > 1 else None
            if tr.lay.dp > 1:
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=tr.groups["dp"][0])
            if flag.item() > 0:
                break
    if args.report:
        with open(f"{args.report}.rank{rank}", "w") as f:
            json.dump({"rank": rank, "pid": os.getpid(), "layout": vars(tr.lay), "iterations": times}, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
