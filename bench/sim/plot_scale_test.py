#!/usr/bin/env python3
"""Tests of plot_scale.py on scale.json documents of known figures: the growth exponents, which
points count, bad input, and the plot itself where matplotlib is importable. Run by ctest
(PlotScaleTest) or: python3 -m unittest bench/sim/plot_scale_test.py"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "plot_scale.py")


def record(n, cores, mb, cmds, verdict="correct", jobs=1):
    """A scale_bench record with the fields plot_scale reads, the times growing with log N."""
    detect = 12.0 + n / 1e4
    return {"ranks": n, "jobs": jobs,
            "controller": {"cores_steady": cores, "cores_peak": 2 * cores, "rss_mb_steady": mb, "hwm_mb": 3 * mb},
            "redis": {"cmds_per_s_steady": cmds, "cmds_per_s_peak": 3 * cmds},
            "incidents": {"verdict": verdict, "detect_s": {"median": detect},
                          "localise_s": {"median": detect + 10}, "pause_s": {"median": 0.5}}}


def doc(records, commit="abc1234"):
    return {"v": 1, "tool": "scale_bench", "commit": commit, "records": records}


class PlotScaleTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, content):
        path = os.path.join(self.dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(content if isinstance(content, str) else json.dumps(content))
        return path

    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)

    def test_exponents_tell_linear_from_quadratic_growth(self):
        path = self.write("a/scale.json", doc([record(n, 1e-4 * n, 0.01 * n, (n / 1000) ** 2 * 100)
                                               for n in (1024, 4096, 16384)]))
        r = self.run_script(path, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        growth = out["growth"]
        self.assertEqual([g["exponent"] for g in growth["controller_cores"]["steady"]], [1.0, 1.0])
        self.assertEqual([g["exponent"] for g in growth["controller_mb"]["VmHWM"]], [1.0, 1.0])
        self.assertEqual([g["exponent"] for g in growth["redis_cmds"]["steady"]], [2.0, 2.0])
        self.assertEqual([(g["from"], g["to"]) for g in growth["redis_cmds"]["peak"]], [(1024, 4096), (4096, 16384)])
        self.assertEqual(growth["times"]["pause"][0]["exponent"], 0.0)
        named = dict((n, v) for n, v in out["figures"]["times"]["detected -> named"])
        self.assertAlmostEqual(named[4096], 10.0)
        self.assertIsNone(out["plot"])

    def test_a_point_not_named_keeps_its_costs_but_not_its_times(self):
        path = self.write("a/scale.json", doc([record(1024, 0.1, 20, 2000), record(4096, 0.4, 80, 8000, "none")]))
        out = json.loads(self.run_script(path, "--json").stdout)
        self.assertEqual(out["figures"]["controller_cores"]["steady"][1], [4096, 0.4])
        self.assertEqual(out["figures"]["times"]["onset -> detected"][1], [4096, None])
        self.assertEqual(out["growth"]["times"]["pause"], [])

    def test_later_files_win_and_many_job_points_are_left_out(self):
        a = self.write("a/scale.json", doc([record(1024, 0.1, 20, 2000), record(64, 9.0, 9, 9, jobs=100)], "aaaa"))
        b = self.write("b/scale.json", doc([record(1024, 0.2, 20, 2000), record(4096, 0.8, 80, 8000)], "bbbb"))
        r = self.run_script(a, b, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("1024 ranks in a (aaaa) and b (bbbb): using b (bbbb)", r.stderr)
        out = json.loads(r.stdout)
        self.assertEqual(sorted(int(n) for n in out["points"]), [1024, 4096])
        self.assertEqual(out["figures"]["controller_cores"]["steady"][0], [1024, 0.2])

    def test_the_table_lists_every_point_and_exponent(self):
        path = self.write("a/scale.json", doc([record(n, 1e-4 * n, 0.01 * n, n) for n in (1024, 4096)]))
        r = self.run_script(path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| 1,024 | 4,096 | exponents |", r.stdout)
        self.assertIn("| falcon-controller steady | 0.10 | 0.41 | 1.00 |", r.stdout)

    def test_bad_input_is_refused_with_a_reason(self):
        cases = [(self.write("x/garbage.json", "{not json"), "garbage.json"),
                 (self.write("y/other.json", {"tool": "something else"}), "not a scale_bench.py scale.json"),
                 (self.write("z/scale.json", doc([record(64, 1, 1, 1, jobs=10)])), "no one-job points"),
                 (os.path.join(self.dir, "absent.json"), "absent.json")]
        for path, why in cases:
            r = self.run_script(path)
            self.assertEqual(r.returncode, 2, path)
            self.assertIn(why, r.stderr)
            self.assertEqual(r.stdout, "")

    @unittest.skipUnless(importlib.util.find_spec("matplotlib"), "matplotlib is not importable")
    def test_the_plot_is_drawn_and_drawn_the_same_twice(self):
        path = self.write("a/scale.json", doc([record(n, 1e-4 * n, 0.01 * n, n) for n in (1024, 4096, 16384, 32768)]))
        out = os.path.join(self.dir, "img")
        first = self.run_script(path, "--out", out, "--title", "one run per point, commit abc1234")
        self.assertEqual(first.returncode, 0, first.stderr)
        svg = os.path.join(out, "scale-cost.svg")
        with open(svg) as f:
            text = f.read()
        self.assertIn("<svg", text)
        self.assertIn("16,384", text)
        self.assertIn("one run per point, commit abc1234", text)
        self.assertIn("falcon-controller, cores", text)
        self.assertEqual(self.run_script(path, "--out", out, "--title", "one run per point, commit abc1234").returncode, 0)
        with open(svg) as f:
            self.assertEqual(f.read(), text)


if __name__ == "__main__":
    unittest.main()
