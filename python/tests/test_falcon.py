"""Tests of the falcon Python package against the real shim, a real falcon-agent and a real
redis-server: plans written by the agent reach the package, acks and costs reach Redis, error
paths raise or return what the docs say, and (where PyTorch is importable) the torch.distributed
hook switches every rank at the same iteration in a multi-process gloo job.

Run by ctest (PythonPackageTest) or by hand:
  FALCON_BUILD_DIR=build python3 -m unittest discover -s python/tests -v
Needs the build's shim, agent and no-op NCCL, and redis-server on PATH.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
sys.path.insert(0, PKG)
import falcon  # noqa: E402  (the package under test, from this checkout)

BUILD = os.path.abspath(os.environ.get("FALCON_BUILD_DIR", os.path.join(PKG, "..", "build")))
SHIM = os.path.join(BUILD, "shim", "libfalcon_shim.so")
AGENT = os.path.join(BUILD, "daemon", "falcon-agent")
NOOP = os.path.join(BUILD, "noop-lib", "libnccl.so.2")
CHILD = os.path.join(HERE, "child_rank.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout_s, step_s=0.05):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step_s)
    return None


def torch_python():
    """A Python that can import torch (with gloo), or None."""
    for py in (sys.executable, "/usr/bin/python3"):
        if py and os.path.exists(py):
            r = subprocess.run([py, "-c", "import torch.distributed as d; assert d.is_available()"],
                               capture_output=True)
            if r.returncode == 0:
                return py
    return None


class WithoutShimTest(unittest.TestCase):
    """A process without the shim: every call is a cheap no-op, bad arguments still raise."""

    def test_everything_is_a_no_op(self):
        falcon._reset_for_tests()
        self.assertFalse(falcon.available())
        self.assertIsNone(falcon.api_version())
        self.assertIsNone(falcon.plan())
        self.assertEqual(falcon.plan_version(), 0)
        self.assertFalse(falcon.ack(1))
        self.assertFalse(falcon.report_cost("S2", 1.0))
        self.assertFalse(falcon.phase_supported())
        self.assertEqual(falcon.current_phase(), "train")
        with falcon.phase("checkpoint"):
            self.assertEqual(falcon.current_phase(), "train")
        with self.assertRaises(falcon.InvalidArgument):
            with falcon.phase("lunch"):
                pass
        with self.assertRaises(falcon.InvalidArgument):
            falcon.report_cost("S7", 1.0)
        with self.assertRaises(ValueError):  # InvalidArgument is a ValueError too
            falcon.ack(0)


class AdaptersTest(unittest.TestCase):
    """Each adapter imports where its framework does (and the Megatron hook works without
    megatron.core, from its arguments), in a Python that has PyTorch."""

    def run_py(self, code):
        py = torch_python()
        if py is None:
            self.skipTest("PyTorch is not importable here")
        env = dict(os.environ, PYTHONPATH=PKG)
        return subprocess.run([py, "-c", code], capture_output=True, text=True, env=env, timeout=120)

    def test_megatron_hook_without_megatron(self):
        r = self.run_py("import falcon.megatron as m\n"
                        "h = m.MegatronHook(num_microbatches=8, dp_rank=1, pp_rank=2)\n"
                        "assert h.num_microbatches() == 8 and h.gradient_weight == 1.0\n"
                        "assert h.warmup_for_stage(2, 4) == 1\n"
                        "import falcon\n"
                        "p = falcon.Plan(version=3, strategy='S2', micro_batches=(4, 12, 8))\n"
                        "assert h._apply(p) and h.num_microbatches() == 12 and abs(h.gradient_weight - 1.5) < 1e-9\n"
                        "p = falcon.Plan(version=4, strategy='pipeline', warmup=(5, 3, 2, 0))\n"
                        "assert h._apply(p) and h.warmup_for_stage(2, 4) == 2\n"
                        "assert h._apply(falcon.Plan(version=5, strategy='S1')) and h.num_microbatches() == 8\n"
                        "print('ok')\n")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_lightning_and_hugging_face_adapters_import_where_their_frameworks_do(self):
        for mod, needs in (("falcon.lightning", ("lightning", "pytorch_lightning")), ("falcon.hf", ("transformers",))):
            probe = self.run_py("import importlib.util, sys\n"
                                f"sys.exit(0 if any(importlib.util.find_spec(n) for n in {needs!r}) else 3)\n")
            if probe.returncode == 3:
                continue  # the framework is not installed here: nothing to import
            r = self.run_py(f"import {mod}\nprint('ok')\n")
            self.assertEqual(r.returncode, 0, f"{mod}: {r.stderr[-800:]}")


@unittest.skipUnless(all(os.path.exists(p) for p in (SHIM, AGENT, NOOP)) and shutil.which("redis-server"),
                     "needs the build (FALCON_BUILD_DIR) and redis-server")
class WithShimTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="falcon-py-")
        self.shm = os.path.join(self.dir, "shm")
        os.makedirs(self.shm)
        self.procs = []
        self.job = "pytest"

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def spawn(self, argv, env=None, log=None):
        out = open(os.path.join(self.dir, log), "w") if log else subprocess.PIPE
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT if log else subprocess.PIPE,
                             text=True)
        if log:
            out.close()  # the child holds its own descriptor
        self.procs.append(p)
        return p

    def child_env(self, rank=0, nranks=1, extra=None):
        env = dict(os.environ, LD_PRELOAD=SHIM, FALCON_SHM_DIR=self.shm, FALCON_JOB=self.job,
                   FALCON_TEST_NOOP_NCCL=NOOP, FALCON_TEST_RANK=str(rank), FALCON_TEST_NRANKS=str(nranks),
                   PYTHONPATH=PKG + (":" + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
        env.update(extra or {})
        return env

    def redis(self, *args):
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True).stdout

    def start_agent(self):
        self.port = free_port()
        self.spawn(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                    "no", "--dir", self.dir], log="redis.log")
        self.assertTrue(wait_until(lambda: self.redis("PING").strip() == "PONG", 10), "redis-server did not start")
        self.spawn([AGENT, "--job", self.job, "--host", "py0", "--shm-dir", self.shm, "--redis-port", str(self.port),
                    "--metrics-port", "0", "--poll-ms", "50", "--heartbeat-ms", "200", "--flush-ms", "100",
                    "--command-block-ms", "100"], log="agent.log")

    def registration(self, rank):
        raw = self.redis("HGET", f"falcon:{{{self.job}}}:rank:{rank}", "msg").strip()
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def send_plan(self, cmd_id, version, micro_batches=None, strategy="S2", **fields):
        plan = {"v": 2, "type": "plan", "id": cmd_id, "issued_ns": time.time_ns(),
                "plan_version": version, "strategy": strategy, **fields}
        if micro_batches is not None:
            plan["micro_batches"] = micro_batches
        msg = json.dumps(plan)
        self.redis("XADD", f"falcon:{{{self.job}}}:commands:py0", "*", "msg", msg)

    def agent_log(self):
        with open(os.path.join(self.dir, "agent.log")) as f:
            return f.read()[-3000:]

    def test_error_paths(self):
        p = self.spawn([sys.executable, CHILD, "errors"], env=self.child_env())
        out, _ = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, out)
        r = json.loads(out.strip().splitlines()[-1])
        self.assertTrue(r["available"])
        self.assertEqual(r["api_version"], 4)
        self.assertIsNone(r["plan_before_any"])
        for k in ("ack0", "cost_nan", "cost_neg", "cost_bad_strategy"):
            self.assertTrue(str(r[k]).startswith("InvalidArgument"), f"{k}: {r[k]}")

    def test_ack_before_the_first_nccl_call_is_refused_quietly(self):
        # No NCCL call yet: the shim has no segment, so there is nothing to ack into.
        p = self.spawn([sys.executable, CHILD, "errors-no-comm"], env=self.child_env())
        out, _ = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, out)
        r = json.loads(out.strip().splitlines()[-1])
        self.assertTrue(r["available"])
        self.assertIsNone(r["plan_before_any"])

    def test_phases_nest_and_the_agent_reports_them(self):
        self.start_agent()
        child = self.spawn([sys.executable, CHILD, "phases"],
                           env=self.child_env(rank=0, nranks=2, extra={"FALCON_TEST_HOLD_S": "3"}))
        reg = wait_until(lambda: (lambda m: m if m and m.get("phase") == "checkpoint" else None)(self.registration(0)),
                         20)
        self.assertIsNotNone(reg, f"the agent never reported the checkpoint phase: {self.registration(0)}\n" +
                             self.agent_log())
        out, _ = child.communicate(timeout=60)
        self.assertEqual(child.returncode, 0, out)
        r = json.loads(out.strip().splitlines()[-1])
        self.assertTrue(r["supported"])
        self.assertEqual(r["seen"], ["train", "checkpoint", "eval", "checkpoint", "train", "InvalidArgument"])

    def test_a_phase_entered_before_the_first_nccl_call_reaches_the_agent(self):
        self.start_agent()
        child = self.spawn([sys.executable, CHILD, "early-phase"],
                           env=self.child_env(rank=0, nranks=2, extra={"FALCON_TEST_HOLD_S": "3"}))
        reg = wait_until(lambda: (lambda m: m if m and m.get("phase") == "eval" else None)(self.registration(0)), 20)
        self.assertIsNotNone(reg, f"no eval phase in {self.registration(0)}\n" + self.agent_log())
        out, _ = child.communicate(timeout=60)
        self.assertEqual(child.returncode, 0, out)
        self.assertEqual(json.loads(out.strip().splitlines()[-1])["phase"], "eval")

    def test_plan_from_a_real_agent_is_read_acked_and_costed(self):
        self.start_agent()
        # A rank of two (the no-op NCCL needs no peer): a rank of one has no rank to register.
        child = self.spawn([sys.executable, CHILD, "wait-plan", "1"], env=self.child_env(rank=0, nranks=2))
        self.assertTrue(wait_until(lambda: self.registration(0), 20), "the agent never registered the rank\n" +
                        self.agent_log())
        self.send_plan("py-plan-1", 1, [2, 6])
        out, _ = child.communicate(timeout=90)
        self.assertEqual(child.returncode, 0, out + self.agent_log())
        r = json.loads(out.strip().splitlines()[-1])
        self.assertEqual(r["plan"]["version"], 1)
        self.assertEqual(r["plan"]["strategy"], "S2")
        self.assertEqual(r["plan"]["micro_batches"], [2, 6])
        self.assertEqual(r["plan"]["placement"], [])
        self.assertGreater(r["plan"]["issued_ns"], 0)
        self.assertTrue(r["ack"])
        self.assertTrue(r["cost"])
        self.assertEqual(r["plan_version"], 1)
        reg = wait_until(lambda: (lambda m: m if m and m.get("plan_applied") == 1 and "cost_s2" in m else None)(
            self.registration(0)), 20)
        self.assertIsNotNone(reg, f"no plan_applied / cost_s2 in the rank's registration: {self.registration(0)}")
        self.assertAlmostEqual(reg["cost_s2"], 1.25)

    def test_pipeline_plan_from_a_real_agent_carries_the_warmup_counts(self):
        self.start_agent()
        child = self.spawn([sys.executable, CHILD, "wait-plan", "2"], env=self.child_env(rank=0, nranks=2))
        self.assertTrue(wait_until(lambda: self.registration(0), 20), "the agent never registered the rank\n" +
                        self.agent_log())
        # Counts that increase along the pipeline would deadlock a job: the agent refuses them.
        self.send_plan("py-pipe-bad", 1, strategy="pipeline", warmup=[1, 3])
        self.send_plan("py-pipe-1", 2, strategy="pipeline", warmup=[3, 1, 0])
        out, _ = child.communicate(timeout=90)
        self.assertEqual(child.returncode, 0, out + self.agent_log())
        r = json.loads(out.strip().splitlines()[-1])
        self.assertEqual(r["plan"]["version"], 2)
        self.assertEqual(r["plan"]["strategy"], "pipeline")
        self.assertEqual(r["plan"]["warmup"], [3, 1, 0])
        self.assertEqual(r["plan"]["micro_batches"], [])
        self.assertIn("must not increase", self.agent_log())

    def test_torch_hook_switches_every_rank_at_the_same_iteration(self):
        py = torch_python()
        if py is None:
            self.skipTest("PyTorch with torch.distributed is not importable here")
        self.start_agent()
        ready = os.path.join(self.dir, "ready")
        port = free_port()
        kids = []
        for r in range(2):
            env = self.child_env(rank=r, nranks=2, extra={"RANK": str(r), "WORLD_SIZE": "2",
                                                          "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                                          "FALCON_TEST_READY_FILE": ready})
            kids.append(self.spawn([py, CHILD, "hook", "400"], env=env))
        self.assertTrue(wait_until(lambda: os.path.exists(ready) and self.registration(0) and self.registration(1),
                                   60), "ranks not up\n" + self.agent_log())
        self.send_plan("py-plan-hook", 1, [2, 6])
        results = []
        for k in kids:
            out, err = k.communicate(timeout=120)
            self.assertEqual(k.returncode, 0, out + err)
            results.append(json.loads(out.strip().splitlines()[-1]))
        results.sort(key=lambda x: x["rank"])
        for x in results:
            self.assertTrue(x["enabled"])
            self.assertEqual(len(x["applied"]), 1, x)
        self.assertEqual(results[0]["applied"][0][0], results[1]["applied"][0][0], "one iteration on every rank")
        self.assertEqual([x["micro_batches"] for x in results], [2, 6])
        self.assertAlmostEqual(results[0]["gradient_weight"], 0.5)
        self.assertAlmostEqual(results[1]["gradient_weight"], 1.5)
        reg = wait_until(lambda: (lambda a, b: (a, b) if a and b and a.get("plan_applied") == 1 and
                                  b.get("plan_applied") == 1 else None)(self.registration(0), self.registration(1)), 20)
        self.assertIsNotNone(reg, "both ranks' acks reach Redis")


if __name__ == "__main__":
    unittest.main()
