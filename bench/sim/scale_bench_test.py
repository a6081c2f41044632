#!/usr/bin/env python3
"""Tests of scale_bench.py's command line that need no build: the CPU lists of --controller-cpus
and the errors of bad ones. Run by ctest (ScaleBenchArgsTest) or:
python3 -m unittest bench/sim/scale_bench_test.py"""
import importlib.util
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scale_bench.py")


def load():
    spec = importlib.util.spec_from_file_location("scale_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class ParseCpusTest(unittest.TestCase):
    def setUp(self):
        self.sb = load()

    def test_lists_and_ranges(self):
        self.assertEqual(self.sb.parse_cpus("1"), {1})
        self.assertEqual(self.sb.parse_cpus("0-2,6"), {0, 1, 2, 6})
        self.assertEqual(self.sb.parse_cpus(" 3 , 3-4"), {3, 4})
        self.assertEqual(self.sb.fmt_cpus({6, 0, 2}), "0,2,6")

    def test_bad_lists(self):
        for bad in ("", "a", "1-", "-1", "3-1", "1,,2", "1.5"):
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                self.sb.parse_cpus(bad)


class CommandLineTest(unittest.TestCase):
    def run_bench(self, *argv):
        return subprocess.run([sys.executable, SCRIPT, "--out", os.devnull, *argv], capture_output=True, text=True,
                              timeout=60)

    def test_a_cpu_not_here_is_refused(self):
        r = self.run_bench("--controller-cpus", "4095")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--controller-cpus: CPUs [4095] are not available here", r.stderr)

    def test_a_malformed_list_is_refused(self):
        r = self.run_bench("--controller-cpus", "1-x")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("is not a CPU number or range", r.stderr)

    def test_every_cpu_for_the_controller_is_refused(self):
        allowed = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        r = self.run_bench("--controller-cpus", allowed)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("leaves no CPU for redis-server and the sims", r.stderr)


if __name__ == "__main__":
    unittest.main()
