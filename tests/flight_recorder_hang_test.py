#!/usr/bin/env python3
"""falcon-ctl hang on PyTorch Flight Recorder dumps, end to end: each scenario of
tests/support/flight_recorder_fixtures.py is written as real 2.x pickles, converted by
scripts/falcon-flight-recorder run by falcon-ctl, and diagnosed; the exit status, the findings
(kind, culprits, waiting ranks) and the missing ranks of `--json` are checked, and the
converter's document on its own (ids, numbering, names). Run by ctest (FlightRecorderHang) with
FALCON_CTL set to the falcon-ctl binary; standard library only."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "support"))
import flight_recorder_fixtures as fixtures  # noqa: E402

SOURCE = os.path.dirname(HERE)
CONVERTER = os.path.join(SOURCE, "scripts", "falcon-flight-recorder")
CTL = os.environ.get("FALCON_CTL", os.path.join(SOURCE, "build", "daemon", "falcon-ctl"))


def run(*args, stdin=None, env=None):
    return subprocess.run(list(args), capture_output=True, text=True, input=stdin, timeout=120, env=env)


def hang(*args, tool=CONVERTER, env=None):
    extra = ["--flight-recorder-tool", tool] if tool else []
    return run(CTL, "hang", *args, *extra, env=env)


class Scenarios(unittest.TestCase):
    """Every fixture through `falcon-ctl hang --flight-recorder DIR --json`."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def check(self, name):
        d = os.path.join(self.tmp.name, name)
        want = fixtures.SCENARIOS[name](d)
        p = hang("--flight-recorder", d, "--json")
        self.assertEqual(p.returncode, want["exit"], f"{name}: stdout {p.stdout[:2000]}\nstderr {p.stderr[:2000]}")
        if want["exit"] == 3:
            self.assertIn("falcon-ctl hang:", p.stderr)
            self.assertEqual(p.stdout, "")
            return
        doc = json.loads(p.stdout)
        self.assertEqual(doc["schema"], 1)
        self.assertEqual(doc["source"], "flight-recorder")
        self.assertEqual(doc["missing_ranks"], want.get("missing", []))
        got = [(f["kind"], f["culprits"], f["waiting"]) for f in doc["findings"]]
        for kind, culprits, waiting in want["findings"]:
            self.assertTrue(any(k == kind and c == culprits and (waiting is None or w == waiting) for k, c, w in got),
                            f"{name}: no {kind} naming {culprits} (waiting {waiting}) in {got}")
        expected_kinds = {k for k, _, _ in want["findings"]} | want.get("allow", set())
        self.assertEqual({k for k, _, _ in got} - expected_kinds, set(), f"{name}: unexpected findings {got}")
        if not want["findings"]:
            self.assertEqual(got, [])
        return doc

    def test_healthy_names_nobody(self):
        doc = self.check("healthy")
        self.assertEqual(doc["ranks"], [0, 1, 2, 3])
        self.assertTrue(all(not c["behind"] and not c["pending"] for c in doc["comms"]))

    def test_a_rank_that_never_issued_the_collective_is_the_culprit(self):
        doc = self.check("not_issued")
        f = doc["findings"][0]
        self.assertEqual((f["seq"], f["op"], f["comm_name"]), (10, "AllReduce", "default_pg"))
        self.assertEqual(f["chain"], [{"rank": 3, "comm": None, "seq": None}])
        self.assertIn("rank 3 issues no NCCL call", f["summary"])

    def test_device_hang_on_one_rank(self):
        self.check("device_hang_one")

    def test_device_hang_on_every_rank(self):
        self.check("device_hang_all")

    def test_count_mismatch(self):
        doc = self.check("mismatch_count")
        f = next(f for f in doc["findings"] if f["kind"] == "mismatch")
        counts = {s["rank"]: s["count"] for s in f["signatures"]}
        self.assertEqual(counts, {0: 1024, 1: 2048, 2: 1024, 3: 1024})

    def test_dtype_mismatch(self):
        doc = self.check("mismatch_dtype")
        f = next(f for f in doc["findings"] if f["kind"] == "mismatch")
        self.assertEqual({s["rank"]: s["dtype"] for s in f["signatures"]},
                         {0: "float32", 1: "float32", 2: "bfloat16", 3: "float32"})

    def test_unmatched_send_and_receive(self):
        self.check("p2p_unmatched")

    def test_coalesced_groups_and_batches_that_match(self):
        self.check("coalesced")

    def test_a_batch_missing_a_receive(self):
        self.check("coalesced_unmatched")

    def test_a_batch_missing_a_receive_in_wrapped_ring_buffers(self):
        self.check("coalesced_ring_buffer")

    def test_incomplete_ranks_are_listed_and_judged_on_the_others(self):
        self.check("incomplete")

    def test_corrupt_truncated_and_unsafe_files_count_as_missing(self):
        self.check("corrupt")

    def test_no_readable_dump_is_bad_input(self):
        self.check("all_corrupt")

    def test_an_unknown_format_major_is_refused(self):
        self.check("unknown_major")
        p = run(sys.executable, CONVERTER, os.path.join(self.tmp.name, "unknown_major"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("format version 3.0 is not supported: this converter reads Flight Recorder format 2.x",
                      p.stderr)

    def test_an_unknown_major_on_one_rank_makes_it_missing(self):
        self.check("mixed_major")

    def test_wrapped_ring_buffers_count_from_ids(self):
        self.check("ring_buffer")


class Converter(unittest.TestCase):
    """scripts/falcon-flight-recorder's document on its own."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def convert(self, name, *extra):
        d = os.path.join(self.tmp.name, name)
        fixtures.SCENARIOS[name](d)
        p = run(sys.executable, CONVERTER, d, *extra)
        self.assertEqual(p.returncode, 0, p.stderr)
        return json.loads(p.stdout), p.stderr

    def test_groups_become_communicators_alike_on_every_member(self):
        doc, _ = self.convert("healthy")
        self.assertEqual((doc["format"], doc["version"], doc["source"]), ("falcon-progress", 1, "flight-recorder"))
        comms = {}
        for r in doc["ranks"]:
            for c in r["comms"]:
                comms.setdefault((c["comm"], c["name"], c["nranks"]), []).append((r["rank"], c["comm_rank"], c["issued"]))
        default = [v for k, v in comms.items() if k[1] == "default_pg"]
        self.assertEqual(default, [[(0, 0, 23), (1, 1, 23), (2, 2, 23), (3, 3, 23)]])
        # split_group: two groups named "1" with different members are two communicators.
        tp = sorted(v for k, v in comms.items() if k[1] == "tp")
        self.assertEqual(tp, [[(0, 0, 5), (1, 1, 5)], [(2, 0, 5), (3, 1, 5)]])
        pairs = [(k, v) for k, v in comms.items() if "p2p" in k[1]]
        self.assertEqual([(k[1], k[2], v) for k, v in pairs], [("default_pg p2p 0<->2", 2, [(0, 0, 6), (2, 1, 6)])])

    def test_calls_carry_zero_based_seqs_and_falcon_names(self):
        doc, _ = self.convert("healthy")
        rank0 = doc["ranks"][0]
        by_seq = {(c["comm"], c["seq"]): c for c in rank0["recent"]}
        default = next(c["comm"] for c in rank0["comms"] if c["name"] == "default_pg")
        self.assertEqual(by_seq[(default, 0)]["op"], "AllReduce")  # collective_seq_id 1
        self.assertEqual([by_seq[(default, s)]["op"] for s in (20, 21, 22)], ["Broadcast", "ReduceScatter", "AllReduce"])
        self.assertEqual((by_seq[(default, 20)]["dtype"], by_seq[(default, 20)]["count"]), ("int64", 64))
        self.assertEqual(by_seq[(default, 21)]["count"], 256)  # the output's elements, NCCL's recvcount
        self.assertEqual(by_seq[(default, 0)]["redop"], None)
        self.assertEqual(by_seq[(default, 0)]["peer"], -1)
        tp = next(c["comm"] for c in doc["ranks"][1]["comms"] if c["name"] == "tp")
        gather = next(c for c in doc["ranks"][1]["recent"] if c["comm"] == tp)
        self.assertEqual((gather["op"], gather["dtype"], gather["count"], gather["seq"]), ("AllGather", "bfloat16", 512, 0))
        sends = [(c["op"], c["seq"], c["peer"]) for c in rank0["recent"] if c["op"] in ("Send", "Recv")]
        self.assertEqual(sends, [("Send", 0, 1), ("Recv", 1, 1), ("Send", 2, 1), ("Recv", 3, 1), ("Send", 4, 1),
                                 ("Recv", 5, 1)])
        recvs = [(c["op"], c["seq"], c["peer"]) for c in doc["ranks"][2]["recent"] if c["op"] in ("Send", "Recv")]
        self.assertEqual(recvs, [("Recv", 0, 0), ("Send", 1, 0), ("Recv", 2, 0), ("Send", 3, 0), ("Recv", 4, 0),
                                 ("Send", 5, 0)])

    def test_coalesced_groups_are_one_call(self):
        doc, _ = self.convert("coalesced")
        default = next(c["comm"] for c in doc["ranks"][0]["comms"] if c["name"] == "default_pg")
        calls = [(c["op"], c["seq"], c["count"]) for c in doc["ranks"][0]["recent"] if c["comm"] == default]
        # 5 all-reduces, a 2.7 group of two all-gathers (256 + 128), a group recorded by its end
        # only, an all_gather_into_tensor_coalesced of two tensors (100 + 200), 2 all-reduces.
        self.assertEqual(calls[5:], [("AllGather", 5, 384), ("GroupEnd", 6, 0), ("AllGather", 7, 300),
                                     ("AllReduce", 8, 1024), ("AllReduce", 9, 1024)])
        self.assertEqual(next(c for c in doc["ranks"][0]["comms"] if c["comm"] == default)["issued"], 10)
        # The ring's batches: each rank's sends to r+1 and receives from r-1, on the pairs' communicators.
        pairs = sorted(c["name"] for c in doc["ranks"][1]["comms"] if "p2p" in c["name"])
        self.assertEqual(pairs, ["default_pg p2p 0<->1", "default_pg p2p 1<->2"])

    def test_wrapped_ring_buffers_keep_counts(self):
        doc, _ = self.convert("ring_buffer")
        issued = {r["rank"]: {c["name"]: (c["issued"], c["completed"]) for c in r["comms"]} for r in doc["ranks"]}
        self.assertEqual([issued[r]["default_pg"] for r in range(4)], [(361, 360)] * 3 + [(360, 360)])
        # Aligned at the completion frontier: rank 0's unmatched send is one call ahead.
        p01 = issued[0]["default_pg p2p 0<->1"], issued[1]["default_pg p2p 0<->1"]
        self.assertEqual(p01[0][0], p01[1][0] + 1)
        self.assertEqual(p01[0][1], p01[1][1])

    def test_missing_ranks_and_unreadable_files_are_reported(self):
        doc, err = self.convert("corrupt")
        self.assertEqual(doc["missing_ranks"], [1, 2, 3])
        self.assertEqual([r["rank"] for r in doc["ranks"]], [0])
        self.assertIn("nccl_trace_rank_1: not a Flight Recorder pickle: refused global collections.OrderedDict", err)
        self.assertIn("nccl_trace_rank_2: truncated: the pickle ends before its last opcode", err)
        self.assertIn("nccl_trace_rank_3: not a Flight Recorder pickle", err)
        self.assertEqual(sorted(u["rank"] for u in doc["flight_recorder"]["unreadable"]), [1, 2, 3])

    def test_a_pickle_that_would_run_code_is_refused_not_run(self):
        d = os.path.join(self.tmp.name, "evil")
        fixtures.SCENARIOS["healthy"](d)
        marker = os.path.join(self.tmp.name, "ran")

        class Evil:
            def __reduce__(self):
                return (os.mkdir, (marker,))

        with open(os.path.join(d, "nccl_trace_rank_3"), "wb") as f:
            f.write(__import__("pickle").dumps({"version": "2.4", "entries": [Evil()]}, protocol=2))
        p = run(sys.executable, CONVERTER, d)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertFalse(os.path.exists(marker))
        self.assertIn("refused global", p.stderr)
        self.assertEqual(json.loads(p.stdout)["missing_ranks"], [3])

    def test_files_can_be_named_one_by_one(self):
        d = os.path.join(self.tmp.name, "files")
        fixtures.SCENARIOS["not_issued"](d)
        renamed = []
        for r in range(4):
            dst = os.path.join(d, f"dump-{r}")
            os.rename(os.path.join(d, f"nccl_trace_rank_{r}"), dst)
            renamed.append(dst)
        p = run(sys.executable, CONVERTER, *renamed)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual([r["rank"] for r in json.loads(p.stdout)["ranks"]], [0, 1, 2, 3])
        p = run(sys.executable, CONVERTER, d)  # no file named nccl_trace_rank_<rank>
        self.assertEqual(p.returncode, 1)
        self.assertIn("no file named nccl_trace_rank_<rank> in it (see --prefix)", p.stderr)
        p = run(sys.executable, CONVERTER, "--prefix", "dump-", d)
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_help(self):
        p = run(sys.executable, CONVERTER, "--help")
        self.assertEqual(p.returncode, 0)
        self.assertIn("falcon-progress", p.stdout)


class Command(unittest.TestCase):
    """falcon-ctl hang's other paths: the report, --progress, the converter lookup, errors."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dumps = os.path.join(self.tmp.name, "dumps")
        fixtures.SCENARIOS["p2p_unmatched"](self.dumps)

    def tearDown(self):
        self.tmp.cleanup()

    def test_report_for_people(self):
        p = hang("--flight-recorder", self.dumps)
        self.assertEqual(p.returncode, 1, p.stderr)
        lines = p.stdout.splitlines()
        self.assertTrue(lines[0].startswith("# falcon-ctl hang "))
        self.assertIn("# wait-for picture: calls issued and completed on the device, per member (calls)", lines)
        self.assertTrue(any("default_pg p2p 0<->1" in l and "1 pending" in l for l in lines), p.stdout)
        self.assertTrue(any(l.endswith("behind by 1") for l in lines), p.stdout)
        self.assertEqual(lines[-1], "# verdict: 2 finding(s) (2 not_issued); culprit rank(s): 1,2")

    def test_progress_document_from_a_file_and_stdin(self):
        converted = run(sys.executable, CONVERTER, self.dumps)
        path = os.path.join(self.tmp.name, "progress.json")
        with open(path, "w") as f:
            f.write(converted.stdout)
        from_dumps = json.loads(hang("--flight-recorder", self.dumps, "--json").stdout)
        for args, stdin in ((["--progress", path], None), (["--progress", "-"], converted.stdout)):
            p = run(CTL, "hang", *args, "--json", stdin=stdin)
            self.assertEqual(p.returncode, 1, p.stderr)
            doc = json.loads(p.stdout)
            self.assertEqual(doc["findings"], from_dumps["findings"])
            self.assertEqual(doc["missing_ranks"], [])

    def test_max_findings(self):
        p = hang("--flight-recorder", self.dumps, "--json", "--max-findings", "1")
        self.assertEqual(p.returncode, 1)
        self.assertEqual(len(json.loads(p.stdout)["findings"]), 1)

    def test_the_converter_is_found_beside_the_build(self):
        env = {k: v for k, v in os.environ.items() if k != "FALCON_FLIGHT_RECORDER_TOOL"}
        p = hang("--flight-recorder", self.dumps, "--json", tool=None, env=env)
        self.assertEqual(p.returncode, 1, p.stderr)  # <build>/share/falcon/falcon-flight-recorder
        env["FALCON_FLIGHT_RECORDER_TOOL"] = os.path.join(self.tmp.name, "absent")
        p = hang("--flight-recorder", self.dumps, tool=None, env=env)
        self.assertEqual(p.returncode, 3)
        self.assertIn("FALCON_FLIGHT_RECORDER_TOOL=", p.stderr)

    def test_usage_errors_exit_2(self):
        for args in ([], ["--progress", "a", "--flight-recorder", "b"], ["--progress", "a", "--max-findings", "0"],
                     ["--progress", "a", "--timeout", "nan"]):
            p = run(CTL, "hang", *args)
            self.assertEqual(p.returncode, 2, f"{args}: {p.stderr}")

    def test_bad_input_exits_3(self):
        bad = os.path.join(self.tmp.name, "bad.json")
        with open(bad, "w") as f:
            json.dump({"format": "falcon-progress", "version": 1,
                       "ranks": [{"rank": 0, "comms": [{"comm": "zz", "nranks": 2, "comm_rank": 0, "issued": 1,
                                                        "completed": 0}]}]}, f)
        for args, message in ((["--progress", os.path.join(self.tmp.name, "absent.json")], "cannot open"),
                              (["--progress", bad], "ranks[0].comms[0].comm: expected up to 16 hex digits"),
                              (["--flight-recorder", os.path.join(self.tmp.name, "empty-dir")], "exited with status 1")):
            os.makedirs(os.path.join(self.tmp.name, "empty-dir"), exist_ok=True)
            p = hang(*args)
            self.assertEqual(p.returncode, 3, f"{args}: {p.stderr}")
            self.assertIn(message, p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
