#!/usr/bin/env python3
"""PyTorch NCCL Flight Recorder dumps for tests: a small model of how ProcessGroupNCCL numbers
and records its work, and the scenarios falcon-ctl hang is tested on.

usage: flight_recorder_fixtures.py SCENARIO DIR     (writes DIR/nccl_trace_rank_<rank>)
       flight_recorder_fixtures.py --list

The files follow the 2.x dump as PyTorch writes it (FlightRecorder::dump and getCollectiveTrace,
torch/csrc/distributed/c10d/FlightRecorder*.{hpp,cpp}): a pickled dict with "version",
"pg_config" ({name: {"name", "desc", "ranks": "[0, 1]"}}), "pg_status" (keyed by str(pg_id))
and "entries" (oldest first; the last `buffer` entries when a ring buffer size is given). The
numbering follows ProcessGroupNCCL.cpp: collective() bumps seqCollective_ before recording, so
ids start at 1; pointToPoint() bumps seqP2P_ per send or receive, or once per batch, and
records the group's current collective_seq_id; a batch's sends and receives are recorded
without events (state "scheduled") and its "nccl:coalesced" end, is_p2p False
(isP2POp(COALESCED)), carries the batch's state; a coalesced collective group bumps
seqCollective_ once for all its members. Standard library only; writes only into DIR.
"""
import os
import pickle
import sys

T0 = 1_700_000_000_000_000_000  # ns since the epoch, as c10::getTime() gives
GLOBAL_PG = "0"

SIZE_RULES = {  # op -> (input elements, output elements) for a per-rank count n in a group of k
    "all_reduce": lambda n, k: (n, n), "broadcast": lambda n, k: (n, n), "reduce": lambda n, k: (n, n),
    "all_reduce_barrier": lambda n, k: (n, n),
    "_allgather_base": lambda n, k: (n, n * k), "all_gather": lambda n, k: (n, n * k),
    "all_gather_into_tensor_coalesced": lambda n, k: (n, n * k),
    "_reduce_scatter_base": lambda n, k: (n * k, n), "reduce_scatter": lambda n, k: (n * k, n),
    "all_to_all": lambda n, k: (n, n), "gather": lambda n, k: (n, n * k), "scatter": lambda n, k: (n * k, n),
}


class Rank:
    def __init__(self, rank):
        self.rank = rank
        self.entries = []
        self.coll = {}   # pg -> seqCollective_
        self.p2p = {}    # pg -> seqP2P_
        self.op_id = {}  # pg -> op_id_
        self.work = {}   # pg -> [(seq, state)] of enqueued work, for pg_status


class Job:
    """One job: its process groups and every rank's recorded entries."""

    def __init__(self, world, version="2.4"):
        self.world = world
        self.version = version
        self.groups = {}  # (name, ranks) -> {"name", "desc", "ranks", "pg_id"}
        self.ranks = [Rank(r) for r in range(world)]
        self.clock = 0
        self.add_group(GLOBAL_PG, "default_pg", range(world))

    def add_group(self, name, desc, ranks):
        ranks = tuple(ranks)
        self.groups[(name, ranks)] = {"name": name, "desc": desc, "ranks": ranks, "pg_id": len(self.groups)}
        return (name, ranks)

    def group_of(self, pg, rank):
        if pg is None:
            pg = (GLOBAL_PG, tuple(range(self.world)))
        return self.groups[pg]

    def _entry(self, rank, g, name, cid, pid, in_counts, out_counts, dtype, state, is_p2p):
        r = self.ranks[rank]
        self.clock += 1000
        t = T0 + self.clock * 1000
        e = {
            "record_id": len(r.entries), "pg_id": g["pg_id"], "process_group": (g["name"], g["desc"]),
            "collective_seq_id": cid, "p2p_seq_id": pid, "op_id": r.op_id.get(g["name"], 0),
            "profiling_name": name, "time_created_ns": t,
            "input_sizes": [[n] for n in in_counts], "input_dtypes": [dtype] * len(in_counts),
            "output_sizes": [[n] for n in out_counts], "output_dtypes": [dtype] * len(out_counts),
            "state": state, "time_discovered_started_ns": t + 10 if state != "scheduled" else None,
            "time_discovered_completed_ns": t + 20 if state == "completed" else None,
            "retired": state == "completed", "timeout_ms": 600000, "is_p2p": is_p2p,
            "thread_id": "140000000000000", "thread_name": "pt_main_thread",
            "frames": [{"name": "train_step", "filename": "train.py", "line": 42}],
        }
        r.entries.append(e)
        return e

    def _bump(self, table, rank, g):
        key = (g["name"], g["ranks"])
        table[key] = table.get(key, 0) + 1
        return table[key]

    def _op_id(self, rank, g):
        r = self.ranks[rank]
        r.op_id[g["name"]] = r.op_id.get(g["name"], 0) + 1

    def collective(self, op, count, dtype="Float", pg=None, ranks=None, state="completed", states=None,
                   counts=None, dtypes=None):
        """One collective on every rank listed (default: the group's members)."""
        g = self.group_of(pg, None if ranks is None else ranks[0])
        for rank in (g["ranks"] if ranks is None else ranks):
            r = self.ranks[rank]
            cid = self._bump(r.coll, rank, g)
            self._op_id(rank, g)
            n = (counts or {}).get(rank, count)
            i, o = SIZE_RULES[op](n, len(g["ranks"]))
            st = (states or {}).get(rank, state)
            self._entry(rank, g, "nccl:" + op, cid, r.p2p.get((g["name"], g["ranks"]), 0), [i], [o],
                        (dtypes or {}).get(rank, dtype), st, False)
            r.work.setdefault((g["name"], g["ranks"]), []).append((cid, st))

    def collective_coalesced(self, op, counts, dtype="Float", pg=None, state="completed"):
        """collectiveCoalesced: one entry, several tensors (e.g. all_gather_into_tensor_coalesced)."""
        g = self.group_of(pg, None)
        for rank in g["ranks"]:
            r = self.ranks[rank]
            cid = self._bump(r.coll, rank, g)
            self._op_id(rank, g)
            ins = [SIZE_RULES[op](n, len(g["ranks"]))[0] for n in counts]
            outs = [SIZE_RULES[op](n, len(g["ranks"]))[1] for n in counts]
            self._entry(rank, g, "nccl:" + op, cid, r.p2p.get((g["name"], g["ranks"]), 0), ins, outs, dtype,
                        state, False)
            r.work.setdefault((g["name"], g["ranks"]), []).append((cid, state))

    def coalesced_group(self, ops, dtype="Float", pg=None, state="completed", record_members=True):
        """startCoalescing ... endCoalescing over collectives: one seq for all; the members are
        recorded one by one from format 2.7 on (record_members), the end always."""
        g = self.group_of(pg, None)
        for rank in g["ranks"]:
            r = self.ranks[rank]
            cid = self._bump(r.coll, rank, g)
            pid = r.p2p.get((g["name"], g["ranks"]), 0)
            for op, n in ops:
                self._op_id(rank, g)
                if record_members:
                    i, o = SIZE_RULES[op](n, len(g["ranks"]))
                    self._entry(rank, g, "nccl:" + op, cid, pid, [i], [o], dtype, "scheduled", False)
            self._entry(rank, g, "nccl:coalesced", cid, pid, [], [], dtype, state, False)
            r.work.setdefault((g["name"], g["ranks"]), []).append((cid, state))

    def _p2p_name(self, g, kind, me, peer):
        a, b = g["ranks"].index(me), g["ranks"].index(peer)
        return f"nccl:send {a}->{b}" if kind == "send" else f"nccl:recv {a}<-{b}"

    def p2p(self, kind, rank, peer, count, dtype="Float", pg=None, state="completed"):
        """A send or receive outside a batch (its own 2-rank communicator in PyTorch)."""
        g = self.group_of(pg, rank)
        r = self.ranks[rank]
        pid = self._bump(r.p2p, rank, g)
        self._op_id(rank, g)
        self._entry(rank, g, self._p2p_name(g, kind, rank, peer), r.coll.get((g["name"], g["ranks"]), 0), pid,
                    [count], [count], dtype, state, True)
        r.work.setdefault((g["name"], g["ranks"]), []).append((pid, state))

    def exchange(self, src, dst, count, dtype="Float", pg=None, state="completed"):
        self.p2p("send", src, dst, count, dtype, pg, state)
        self.p2p("recv", dst, src, count, dtype, pg, state)

    def batch(self, rank, ops, dtype="Float", pg=None, state="completed"):
        """batch_isend_irecv on one rank: ops = [("send" | "recv", peer, count)]."""
        g = self.group_of(pg, rank)
        r = self.ranks[rank]
        pid = self._bump(r.p2p, rank, g)
        cid = r.coll.get((g["name"], g["ranks"]), 0)
        for kind, peer, count in ops:
            self._op_id(rank, g)
            self._entry(rank, g, self._p2p_name(g, kind, rank, peer), cid, pid, [count], [count], dtype,
                        "scheduled", True)
        self._entry(rank, g, "nccl:coalesced", cid, pid, [], [], dtype, state, False)
        r.work.setdefault((g["name"], g["ranks"]), []).append((pid, state))

    def dump(self, rank, buffer=None, version=None):
        r = self.ranks[rank]
        pg_config, pg_status = {}, {}
        for key, g in self.groups.items():
            if rank not in g["ranks"]:
                continue
            pg_config[g["name"]] = {"name": g["name"], "desc": g["desc"], "ranks": "[" + ", ".join(map(str, g["ranks"])) + "]"}
            work = r.work.get(key, [])
            last = lambda states: max((s for s, st in work if st in states), default=-1)  # noqa: E731
            pg_status[str(g["pg_id"])] = {"last_enqueued_collective": work[-1][0] if work else -1,
                                          "last_started_collective": last(("started", "completed")),
                                          "last_completed_collective": last(("completed",))}
        entries = r.entries if buffer is None else r.entries[-buffer:]
        return {"version": version or self.version, "comm_lib_version": "2.21.5", "pg_config": pg_config,
                "pg_status": pg_status, "entries": entries}

    def write(self, out_dir, ranks=None, buffer=None, versions=None, prefix="nccl_trace_rank_"):
        os.makedirs(out_dir, exist_ok=True)
        for rank in range(self.world) if ranks is None else ranks:
            with open(os.path.join(out_dir, f"{prefix}{rank}"), "wb") as f:
                pickle.dump(self.dump(rank, buffer, (versions or {}).get(rank)), f, protocol=2)


# ---- scenarios: each writes DIR and returns what the diagnosis must find -------------------

def warmup(job, n=10, count=1024):
    for _ in range(n):
        job.collective("all_reduce", count)


def healthy(d):
    job = Job(4)
    tp_a = job.add_group("1", "tp", (0, 1))  # split_group: the same name for disjoint members
    tp_b = job.add_group("1", "tp", (2, 3))
    warmup(job, 20)
    for pg in (tp_a, tp_b):
        for _ in range(5):
            job.collective("_allgather_base", 512, "BFloat16", pg=pg)
    job.collective("broadcast", 64, "Long")
    job.collective("reduce_scatter", 256)
    job.collective("all_reduce_barrier", 1)
    for _ in range(3):
        job.exchange(0, 2, 4096, "BFloat16")
        job.exchange(2, 0, 4096, "BFloat16")
    job.write(d)
    return {"exit": 0, "findings": []}


def not_issued(d):
    job = Job(4)
    warmup(job)
    job.collective("all_reduce", 1024, ranks=[0, 1, 2], state="started")
    job.write(d)
    return {"exit": 1, "findings": [("not_issued", [3], [0, 1, 2])]}


def device_hang_one(d):
    job = Job(4)
    warmup(job)
    job.collective("all_reduce", 1024, states={2: "started"})
    job.write(d)
    return {"exit": 1, "findings": [("not_completing", [2], [2])]}


def device_hang_all(d):
    job = Job(4)
    warmup(job)
    job.collective("all_reduce", 1024, state="started")
    job.write(d)
    return {"exit": 1, "findings": [("not_completing", [], [0, 1, 2, 3])]}


def mismatch_count(d):
    job = Job(4)
    warmup(job)
    job.collective("all_reduce", 1024, state="started", counts={1: 2048})
    job.write(d)
    # The mismatched all-reduce hangs on every rank as well.
    return {"exit": 1, "findings": [("mismatch", [1], None), ("not_completing", [], [0, 1, 2, 3])]}


def mismatch_dtype(d):
    job = Job(4)
    warmup(job)
    job.collective("all_reduce", 1024, state="started", dtypes={2: "BFloat16"})
    job.write(d)
    # The mismatched all-reduce hangs on every rank as well.
    return {"exit": 1, "findings": [("mismatch", [2], None), ("not_completing", [], [0, 1, 2, 3])]}


def p2p_unmatched(d):
    job = Job(4)
    warmup(job)
    for _ in range(4):
        job.exchange(0, 1, 8192)
        job.exchange(2, 3, 8192)
    job.p2p("send", 0, 1, 8192, state="started")   # rank 1 never posts this receive
    job.p2p("recv", 3, 2, 8192, state="scheduled")  # rank 2 never sends this
    job.write(d)
    return {"exit": 1, "findings": [("not_issued", [1], [0]), ("not_issued", [2], [3])]}


def _ring(job, state="completed", skip=None):
    """One batch_isend_irecv ring step: r sends to r+1, receives from r-1 (skip: (rank, op))."""
    n = job.world
    for r in range(n):
        ops = [("send", (r + 1) % n, 2048), ("recv", (r - 1) % n, 2048)]
        ops = [op for op in ops if skip is None or (r, op[0]) != skip]
        job.batch(r, ops, state=state(r) if callable(state) else state)


def coalesced(d):
    job = Job(4, version="2.7")
    warmup(job, 5)
    for _ in range(3):
        _ring(job)
    job.coalesced_group([("_allgather_base", 256), ("_allgather_base", 128)])   # members recorded (2.7)
    job.coalesced_group([("all_reduce", 64), ("all_reduce", 64)], record_members=False)  # older: the end only
    job.collective_coalesced("all_gather_into_tensor_coalesced", [100, 200])
    warmup(job, 2)
    job.write(d)
    return {"exit": 0, "findings": []}


def coalesced_unmatched(d):
    job = Job(4, version="2.7")
    warmup(job, 5)
    for _ in range(2):
        _ring(job)
    # Rank 2's last batch lacks the receive from rank 1: rank 1's batch never completes.
    _ring(job, state=lambda r: "started" if r == 1 else "completed", skip=(2, "recv"))
    job.write(d)
    # Rank 1's batch completes as one, so its receive from rank 0 is pending too: not_completing
    # on pair 0<->1 beside the finding that explains it.
    return {"exit": 1, "findings": [("not_issued", [2], [1])], "allow": {"not_completing"}}


def coalesced_ring_buffer(d):
    """coalesced_unmatched after many steps, each rank keeping only its last 40 entries: the
    counterparts of rank 1's batch are found by time, not by count."""
    job = Job(4, version="2.7")
    for _ in range(30):
        _ring(job)
        job.collective("all_reduce", 64)
    _ring(job, state=lambda r: "started" if r == 1 else "completed", skip=(2, "recv"))
    job.write(d, buffer=40)
    return {"exit": 1, "findings": [("not_issued", [2], [1])], "allow": {"not_completing"}}


def incomplete(d):
    job = Job(4)
    warmup(job)
    job.collective("all_reduce", 1024, state="started")
    job.write(d, ranks=[0, 1, 2])
    return {"exit": 0, "findings": [], "missing": [3]}


def corrupt(d):
    job = Job(4)
    warmup(job)
    job.write(d)
    with open(os.path.join(d, "nccl_trace_rank_2"), "rb") as f:
        whole = f.read()
    with open(os.path.join(d, "nccl_trace_rank_2"), "wb") as f:
        f.write(whole[: len(whole) // 2])  # truncated
    with open(os.path.join(d, "nccl_trace_rank_3"), "wb") as f:
        f.write(b"this is not a pickle\n")
    with open(os.path.join(d, "nccl_trace_rank_1"), "wb") as f:
        import collections
        f.write(pickle.dumps(collections.OrderedDict(version="2.4"), protocol=2))  # a global: refused
    return {"exit": 0, "findings": [], "missing": [1, 2, 3]}


def all_corrupt(d):
    os.makedirs(d, exist_ok=True)
    for r in range(2):
        with open(os.path.join(d, f"nccl_trace_rank_{r}"), "wb") as f:
            f.write(b"\x80\x02}q\x00(X")  # a pickle cut short
    return {"exit": 3, "findings": []}


def unknown_major(d):
    job = Job(2, version="3.0")
    warmup(job)
    job.write(d)
    return {"exit": 3, "findings": []}


def mixed_major(d):
    job = Job(4)
    warmup(job)
    job.collective("all_reduce", 1024, ranks=[0, 1, 2], state="started")
    job.write(d, versions={3: "3.1"})
    return {"exit": 0, "findings": [], "missing": [3]}


def ring_buffer(d):
    """Buffers that kept only their last 64 entries, at different points on each rank: counts
    come from the ids, point-to-point counts are aligned at the completion frontier."""
    job = Job(4)
    for i in range(300):
        job.collective("all_reduce", 1024)
        if i % 3 == 0:
            job.exchange(0, 1, 512)
        if i % 5 == 0:
            job.collective("all_reduce", 8, ranks=None)
    for _ in range(7):
        job.exchange(2, 3, 512)  # more traffic on 2 and 3: their windows start later
    job.collective("all_reduce", 1024, ranks=[0, 1, 2], state="started")
    job.p2p("send", 0, 1, 512, state="started")
    job.write(d, buffer=64)
    # Rank 1 never posts the receive because it waits for rank 3 in the all-reduce: the chain
    # from the unmatched send ends at rank 3 too.
    return {"exit": 1, "findings": [("not_issued", [3], [0, 1, 2]), ("not_issued", [3], [0])]}


SCENARIOS = {f.__name__: f for f in (healthy, not_issued, device_hang_one, device_hang_all, mismatch_count,
                                     mismatch_dtype, p2p_unmatched, coalesced, coalesced_unmatched, coalesced_ring_buffer,
                                     incomplete,
                                     corrupt, all_corrupt, unknown_major, mixed_major, ring_buffer)}


def main(argv):
    if argv[1:] == ["--list"]:
        print("\n".join(SCENARIOS))
        return 0
    if len(argv) != 3 or argv[1] not in SCENARIOS:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    SCENARIOS[argv[1]](argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
