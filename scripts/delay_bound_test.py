#!/usr/bin/env python3
"""Tests for delay_bound.py on constructed traces whose answers are known (run by ctest)."""
import json, math, os, random, subprocess, sys, tempfile, unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "delay_bound.py")


def write_trace(tdir, name, levels, cov=0.005, seed=1, labelled=None):
    """levels: list of (count, ratio); samples are 2.0 s x ratio x lognormal noise."""
    rng = random.Random(seed)
    rows, label_on = [], labelled or []
    for count, ratio in levels:
        for _ in range(count):
            rows.append(2.0 * ratio * math.exp(rng.gauss(0.0, cov)))
    with open(os.path.join(tdir, name), "w") as f:
        f.write("iter,seconds,label\n")
        for i, v in enumerate(rows):
            inside = any(s <= i < e for s, e in label_on)
            f.write(f"{i},{v:.6f},{int(inside)}\n")
    return len(rows)


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


class DelayBoundTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        # ladder: 1.05 x for 40 iterations, then 1.20 x: the rule allows an alarm at offset 40.
        n1 = write_trace(self.dir, "0000-ladder.csv", [(200, 1.0), (40, 1.05), (60, 1.20), (100, 1.0)],
                         labelled=[(200, 300)])
        # step of 1.30 x: allowed at once.
        n2 = write_trace(self.dir, "0001-step.csv", [(200, 1.0), (50, 1.30), (100, 1.0)], seed=2,
                         labelled=[(200, 250)])
        # 1.05 x only: never passes a 10 % rule.
        n3 = write_trace(self.dir, "0002-small.csv", [(200, 1.0), (80, 1.05), (100, 1.0)], seed=3,
                         labelled=[(200, 280)])
        # healthy: a benign 1.07 x level for 30 iterations, and a flat one.
        n4 = write_trace(self.dir, "0003-healthy.csv", [(200, 1.0), (30, 1.07), (100, 1.0)], seed=4)
        n5 = write_trace(self.dir, "0004-healthy.csv", [(330, 1.0)], seed=5)
        index = [
            {"file": "0000-ladder.csv", "failslow": [[200, 300]], "iterations": n1},
            {"file": "0001-step.csv", "failslow": [[200, 250]], "iterations": n2},
            {"file": "0002-small.csv", "failslow": [[200, 280]], "iterations": n3},
            {"file": "0003-healthy.csv", "failslow": [], "iterations": n4},
            {"file": "0004-healthy.csv", "failslow": [], "iterations": n5},
        ]
        with open(os.path.join(self.dir, "index.json"), "w") as f:
            json.dump(index, f)

    def tearDown(self):
        self.tmp.cleanup()

    def summary(self, *extra):
        out = run(self.dir, "--json", "-v", *extra)
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout)

    def test_bounds_are_the_first_level_past_the_rule(self):
        doc = self.summary()
        bounds = {ev["file"]: ev["bound"] for ev in doc["events"]}
        self.assertEqual(bounds["0000-ladder.csv"], 40)
        self.assertEqual(bounds["0001-step.csv"], 0)
        self.assertIsNone(bounds["0002-small.csv"])
        self.assertEqual(doc["summary"]["never_passes_rule"], 1)
        ladder = next(ev for ev in doc["events"] if ev["file"] == "0000-ladder.csv")
        self.assertEqual([lv[0] for lv in ladder["levels"]], [0, 40])
        self.assertAlmostEqual(ladder["levels"][1][1], 1.20, delta=0.01)

    def test_a_lower_rule_moves_the_bound(self):
        doc = self.summary("--min-change", "0.03")
        bounds = {ev["file"]: ev["bound"] for ev in doc["events"]}
        self.assertEqual(bounds["0000-ladder.csv"], 0)
        self.assertEqual(bounds["0002-small.csv"], 0)

    def test_best_p95_at_recall_may_skip_the_slowest_intervals(self):
        # 3 intervals, one never passes: a detector finding 2 of 3 can have delays 0 and 40.
        self.assertEqual(self.summary("--recall", "0.6")["summary"]["best_p95_at_recall"], 40)
        self.assertIsNone(self.summary("--recall", "1.0")["summary"]["best_p95_at_recall"])

    def test_without_the_rule_the_needed_alarm_level_flags_healthy_traces(self):
        # Both intervals past the target must be caught on their 1.05 x first level; the healthy
        # trace with a 1.07 x level lasting 30 iterations would then be a false positive.
        s = self.summary()["summary"]
        self.assertEqual(s["bound_over_target"], 1)
        self.assertAlmostEqual(s["alarm_level_needed"], 1.05, delta=0.01)
        self.assertEqual(s["healthy_traces"], 2)
        self.assertEqual(s["healthy_files"], ["0003-healthy.csv"])
        # With a target of 40 the ladder's bound (40) is within it.
        self.assertEqual(self.summary("--target-p95", "40")["summary"]["bound_over_target"], 0)

    def test_detector_delays_are_counted_as_score_py_does(self):
        res = os.path.join(self.dir, "results")
        os.mkdir(res)
        outputs = {
            "0000-ladder": [{"at": 150, "type": "slow"}, {"at": 245, "type": "slow"},
                            {"at": 303, "type": "recovered"}],
            "0001-step": [{"at": 204, "type": "slow"}],
            "0002-small": [],
            "0003-healthy": [],
            "0004-healthy": [],
        }
        for name, alarms in outputs.items():
            with open(os.path.join(res, name + ".json"), "w") as f:
                json.dump({"alarms": alarms}, f)
        s = self.summary("--results", res)["summary"]
        self.assertEqual(s["detected"], 2)  # the alarm at 150 is before the interval
        self.assertEqual(sorted([s["delay_p50"], s["delay_p95"]]), [4, 45])
        self.assertEqual(s["delay_after_bound_p95"], 5)
        text = run(self.dir, "--results", res)
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn("counted from the bound", text.stdout)

    def test_labels_alone_define_the_intervals_without_an_index(self):
        os.remove(os.path.join(self.dir, "index.json"))
        bounds = {ev["file"]: (ev["start"], ev["end"], ev["bound"])
                  for ev in self.summary()["events"]}
        self.assertEqual(bounds["0000-ladder.csv"], (200, 300, 40))

    def test_bad_input_is_an_error_not_a_figure(self):
        out = run(os.path.join(self.dir, "missing"))
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("not a directory", out.stderr)
        out = run(self.dir, "--results", os.path.join(self.dir, "nowhere"))
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("nowhere", out.stderr)
        with open(os.path.join(self.dir, "0001-step.csv"), "a") as f:
            f.write("350,-1,0\n")
        out = run(self.dir)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("0001-step.csv", out.stderr)
        with open(os.path.join(self.dir, "0002-small.csv"), "a") as f:
            f.write("380,fast,0\n")
        os.remove(os.path.join(self.dir, "0001-step.csv"))
        write_trace(self.dir, "0001-step.csv", [(200, 1.0), (50, 1.30), (100, 1.0)], seed=2)
        out = run(self.dir)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("0002-small.csv:382", out.stderr)


if __name__ == "__main__":
    unittest.main()
