#!/usr/bin/env python3
"""One rank of the GPU kit's call-coverage job: every class of NCCL call PyTorch makes.

Started once per rank by gpu_check.py (environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
and NCCL_HOSTID distinct per rank so that several ranks can share one GPU). It runs each case
on deterministic, integer-valued inputs (sums are exact in every dtype, so results do not depend
on NCCL's reduction order), and writes one JSON file: per case, "ok" and a SHA-256 of its result
or the error it raised; then, for the timing check, per all-reduce of a timed series the device
time between torch.cuda.Events on the current stream around the call.

The cases: all-reduce (sum, avg, max, min, pre-multiplied sum; fp32, bf16, fp16, int32, int64),
broadcast, reduce, all-gather, reduce-scatter, all-to-all, gather, scatter, send/recv, a
batch_isend_irecv ring (grouped send/recv), barrier, sub-groups made the way torch makes them
(ncclCommSplit when the default group is bound to a device), a group with a nonblocking NCCL
config, and an all-reduce captured into a CUDA graph and replayed. PyTorch's own watchdog thread
polls every communicator (ncclCommGetAsyncError) throughout, as in any torch.distributed job.

  python3 calls_worker.py --out rank.json [--backend nccl|gloo] [--timing-reps N]
"""
import argparse
import hashlib
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

# Element counts of the timed series: distinct from every count the cases use, so that the
# kit can find their records in the shim's log by (op, count).
TIMED_COUNTS = (1031, 16411, 262147, 1048583, 4194319, 16777259)


def digest(t):
    t = t.detach().contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    return hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()[:16]


class Cases:
    def __init__(self, rank, world, device, backend):
        self.rank, self.world, self.dev, self.backend = rank, world, device, backend
        self.results = {}

    def data(self, n, dtype=torch.float32, salt=0):
        # Small integers: every sum, average of world ranks and pre-multiplied sum stays exact.
        base = torch.arange(n, device=self.dev, dtype=torch.int64)
        return ((base + self.rank + salt) % 8).to(dtype)

    def run(self, name, fn):
        try:
            out = fn()
            if self.dev.type == "cuda":
                torch.cuda.synchronize(self.dev)
            self.results[name] = {"ok": True, "digest": digest(out)}
        except Exception as e:  # the case's outcome, compared between runs with and without the shim
            self.results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}

    def collectives(self):
        r, w = self.rank, self.world
        n = 1 << 20
        for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64):
            name = str(dtype).replace("torch.", "")

            def ar(dtype=dtype):
                x = self.data(n, dtype)
                dist.all_reduce(x)
                return x
            self.run(f"all_reduce_sum_{name}", ar)
        for opname in ("MAX", "MIN", "AVG"):
            def ar_op(opname=opname):
                x = self.data(n, torch.float32, salt=3) * w  # AVG of multiples of w stays exact
                dist.all_reduce(x, op=getattr(dist.ReduceOp, opname))
                return x
            if opname == "AVG" and self.backend != "nccl":
                continue  # gloo has no AVG
            self.run(f"all_reduce_{opname.lower()}", ar_op)
        if self.backend == "nccl":
            def premul():
                x = self.data(n, torch.float32, salt=5)
                dist.all_reduce(x, op=dist._make_nccl_premul_sum(2.0))
                return x
            self.run("all_reduce_premul_sum", premul)

        def bcast():
            x = self.data(n, torch.float32, salt=1)
            dist.broadcast(x, src=1 % w)
            return x
        self.run("broadcast", bcast)

        def reduce():
            x = self.data(n, torch.float32, salt=2)
            dist.reduce(x, dst=(2 % w))
            return x if r == 2 % w else torch.zeros(1, device=self.dev)
        self.run("reduce", reduce)

        def allgather():
            x = self.data(n // w, torch.bfloat16, salt=4)
            out = torch.empty(n // w * w, device=self.dev, dtype=torch.bfloat16)
            dist.all_gather_into_tensor(out, x)
            return out
        self.run("all_gather", allgather)

        def reduce_scatter():
            x = self.data(n, torch.float32, salt=6)
            out = torch.empty(n // w, device=self.dev)
            dist.reduce_scatter_tensor(out, x)
            return out
        self.run("reduce_scatter", reduce_scatter)

        def alltoall():
            x = self.data(n, torch.float32, salt=7) + 10 * r
            out = torch.empty_like(x)
            dist.all_to_all_single(out, x)
            return out
        self.run("all_to_all", alltoall)

        def gather():
            x = self.data(4096, torch.float32, salt=8)
            lst = [torch.empty_like(x) for _ in range(w)] if r == 0 else None
            dist.gather(x, lst, dst=0)
            return torch.cat(lst) if r == 0 else x
        self.run("gather", gather)

        def scatter():
            out = torch.empty(4096, device=self.dev)
            lst = [self.data(4096, torch.float32, salt=9) + i for i in range(w)] if r == 0 else None
            dist.scatter(out, lst, src=0)
            return out
        self.run("scatter", scatter)

        def sendrecv():
            x = self.data(65536, torch.float32, salt=10)
            y = torch.empty_like(x)
            if r % 2 == 0:
                dist.send(x, dst=(r + 1) % w)
                dist.recv(y, src=(r + 1) % w)
            else:
                dist.recv(y, src=(r - 1) % w)
                dist.send(x, dst=(r - 1) % w)
            return y
        self.run("send_recv", sendrecv)

        def ring():
            x = self.data(65536, torch.float32, salt=11)
            y = torch.empty_like(x)
            ops = [dist.P2POp(dist.isend, x, (r + 1) % w), dist.P2POp(dist.irecv, y, (r - 1) % w)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            return y
        self.run("batch_isend_irecv", ring)
        self.run("barrier", lambda: (dist.barrier(), torch.zeros(1))[1])

    def groups(self):
        r, w = self.rank, self.world
        # Every rank creates every group, in the same order (as Megatron does): pairs, then all.
        pairs = [dist.new_group([i, i + 1]) for i in range(0, w - 1, 2)]
        mine = pairs[r // 2] if r // 2 < len(pairs) else None

        def sub_all_reduce():
            x = self.data(1 << 18, torch.float32, salt=12)
            if mine is not None:
                dist.all_reduce(x, group=mine)
            return x
        self.run("subgroup_all_reduce", sub_all_reduce)
        if self.backend == "nccl":
            def nonblocking():
                opts = dist.ProcessGroupNCCL.Options()
                opts.config.blocking = 0
                g = dist.new_group(list(range(w)), pg_options=opts)
                x = self.data(1 << 18, torch.float32, salt=13)
                dist.all_reduce(x, group=g)
                y = self.data(1 << 16, torch.float32, salt=14)
                dist.broadcast(y, src=0, group=g)
                return torch.cat([x, y])
            self.run("nonblocking_group", nonblocking)

    def graph(self):
        if self.dev.type != "cuda":
            return

        def captured():
            x = torch.ones(1 << 16, device=self.dev)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # warm-up outside the capture, as torch.cuda.graph wants
                for _ in range(2):
                    dist.all_reduce(x)
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            x.fill_(1.0)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                dist.all_reduce(x)
            x.fill_(1.0)
            for _ in range(3):  # replays: no NCCL API call, the graph's kernel runs
                g.replay()
            torch.cuda.synchronize()
            expect = float(self.world ** 3)
            if not torch.all(x == expect):
                raise RuntimeError(f"graph replay result {x[0].item()} != {expect}")
            return x
        self.run("graph_all_reduce", captured)

    def timed(self, reps):
        """All-reduces of TIMED_COUNTS floats, each timed by torch.cuda.Events on the current stream
        after a barrier (so that ranks enter together) and a synchronise (nothing queued before)."""
        out = []
        if self.dev.type != "cuda":
            return out
        for count in TIMED_COUNTS:
            x = torch.ones(count, device=self.dev)
            for rep in range(reps):
                dist.barrier()
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                dist.all_reduce(x)
                e1.record()
                e1.synchronize()
                out.append({"count": count, "rep": rep, "torch_ms": e0.elapsed_time(e1)})
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    ap.add_argument("--timing-reps", type=int, default=10)
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    t0 = time.time()
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_DEVICE", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    c = Cases(rank, world, device, args.backend)
    report = {"rank": rank, "pid": os.getpid(), "torch": torch.__version__, "cases": None, "timed": []}
    try:
        if args.backend == "nccl":
            report["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        c.collectives()
        c.groups()
        c.graph()
        report["timed"] = c.timed(args.timing_reps)
        dist.barrier()
    except Exception:
        report["fatal"] = traceback.format_exc()[-2000:]
    report["cases"] = c.results
    report["seconds"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()
    return 0 if "fatal" not in report else 1


if __name__ == "__main__":
    sys.exit(main())
