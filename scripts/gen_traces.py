#!/usr/bin/env python3
"""Generate labelled iteration-time traces with many noise shapes, for scoring fail-slow detectors.

usage: gen_traces.py OUT_DIR [--seed N] [--per-kind K]

Writes OUT_DIR/NNNN-kind.csv (`iter,seconds,label`, label 1 inside a fail-slow interval) and
OUT_DIR/index.json in the format of /work/shared/traces, so its score.py scores them:

    python3 score.py OUT_DIR -- falcon-ctl analyze-trace {file} --json

The point is generalisation: the detector must not be tuned to one noise shape. Every trace draws
  - a noise family: gauss, student_t (3-6 degrees of freedom), laplace, lognormal, ar1
    (correlated, phi 0.3-0.7), all multiplicative (seconds = base * exp(noise) * effects);
  - a noise level (CoV 0.5-3 %, 2-5 % for `hard`), a base time (0.05-60 s), a length;
  - benign effects that are NOT fail-slows (no alarm wanted): isolated spikes (rate 0-4 %,
    1.3-4x), bursts of 2-4 spiky iterations, checkpoint/evaluation pauses (3-15x for one or two
    iterations, every 100-1000 iterations or never), short benign drifts (2-7 % for 20-80
    iterations) and slow drifts (+-3-8 % over thousands of iterations).
Kinds (the same four as the shared traces, with other shapes):
  - healthy: benign effects only;
  - compute: one or two step fail-slows of 1.15-2x lasting 30-600 iterations;
  - comm: one to three fail-slows of 1.15-5x lasting 60-800 iterations, step or ladder
    (2-4 stages, first stage >= 1.12x, so the labelled start is detectable under the 10 % rule);
  - hard: noisier baselines with fail-slows of 1.12-1.3x lasting 10-300 iterations.
Standard library only; the same seed gives the same files.
"""
import argparse, json, math, os, random

FAMILIES = ["gauss", "student_t", "laplace", "lognormal", "ar1"]


class Noise:
    """One noise process: draw() returns the next log-time deviation, with sd about `cov`."""

    def __init__(self, rng, family, cov):
        self.rng, self.family, self.cov = rng, family, cov
        self.df = rng.randint(3, 6)
        self.phi = rng.uniform(0.3, 0.7)
        self.prev = 0.0
        # student_t: either unit scale (heavier) or unit variance, so both readings of "CoV" occur.
        self.t_scale = 1.0 if rng.random() < 0.5 else math.sqrt((self.df - 2) / self.df)

    def student_t(self):
        z = self.rng.gauss(0.0, 1.0)
        chi2 = sum(self.rng.gauss(0.0, 1.0) ** 2 for _ in range(self.df))
        return z / math.sqrt(chi2 / self.df)

    def draw(self):
        r, c = self.rng, self.cov
        if self.family == "gauss":
            return c * r.gauss(0.0, 1.0)
        if self.family == "student_t":
            return c * self.t_scale * self.student_t()
        if self.family == "laplace":
            u = r.random() - 0.5
            return -c / math.sqrt(2.0) * math.copysign(1.0, u) * math.log(1.0 - 2.0 * abs(u))
        if self.family == "lognormal":
            return r.gauss(0.0, c)
        self.prev = self.phi * self.prev + math.sqrt(1.0 - self.phi ** 2) * r.gauss(0.0, c)
        return self.prev


def benign_effects(rng, n):
    """Multiplicative factors for spikes, bursts, pauses and drifts; also the pause period."""
    f = [1.0] * n
    rate = rng.choice([0.0, 0.005, 0.01, 0.02, 0.03, 0.04])
    for i in range(n):
        if rng.random() < rate:
            f[i] *= rng.uniform(1.3, 4.0)
    if rng.random() < 0.4:  # bursts of spiky iterations (a noisy neighbour, swapping)
        for _ in range(rng.randint(1, max(1, n // 400))):
            s = rng.randrange(20, n - 5)
            for i in range(s, min(n, s + rng.randint(2, 4))):
                f[i] *= rng.uniform(1.3, 3.0)
    every = rng.choice([0, 100, 200, 300, 500, 1000])
    if every:
        for i in range(every, n, every):
            f[i] *= rng.uniform(3.0, 15.0)
            if rng.random() < 0.3 and i + 1 < n:  # evaluation: a second slow iteration
                f[i + 1] *= rng.uniform(1.5, 5.0)
    drift = rng.random()
    if drift < 0.4:  # short benign drift, below the 10 % fail-slow bar
        s, length, amp = rng.randrange(20, n - 100), rng.randint(20, 80), rng.uniform(0.02, 0.07)
        for i in range(s, s + length):
            f[i] *= 1.0 + amp
    elif drift < 0.8:  # slow drift (dataset shards, thermal): periods of >= 2000 iterations
        amp = rng.uniform(0.03, 0.08) * rng.choice([-1, 1])
        waves = rng.uniform(0.3, max(0.3, n / 2000.0))
        for i in range(n):
            f[i] *= 1.0 + amp * 0.5 * (1.0 - math.cos(2.0 * math.pi * waves * i / n))
    return f, every


def place(rng, n, durations):
    """Non-overlapping [start, end) intervals of the given lengths, >= 100 iterations apart."""
    for _ in range(1000):
        iv = sorted((s, s + d) for d in durations for s in [rng.randrange(100, n - d - 50)])
        if all(iv[k + 1][0] - iv[k][1] >= 100 for k in range(len(iv) - 1)):
            return iv
    return []


def fail_slows(rng, kind, n):
    """Events [{start, end, ratio, shape, stages}] for a kind."""
    if kind == "healthy":
        return []
    if kind == "compute":
        count, lo, hi, dmin, dmax = rng.randint(1, 2), 1.15, 2.0, 30, 600
    elif kind == "comm":
        count, lo, hi, dmin, dmax = rng.randint(1, 3), 1.15, 5.0, 60, 800
    else:
        count, lo, hi, dmin, dmax = rng.randint(1, 2), 1.12, 1.3, 10, 300
    durations = [rng.randint(dmin, min(dmax, n // (2 * count))) for _ in range(count)]
    events = []
    for s, e in place(rng, n, durations):
        ratio = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        shape = "ladder" if kind == "comm" and ratio >= 1.3 and rng.random() < 0.5 else "step"
        stages = [(s, ratio)]
        if shape == "ladder":
            m = rng.randint(2, 4)
            first = rng.uniform(1.12, min(1.5, ratio ** 0.7))
            bounds = sorted(rng.sample(range(s + 10, e - 10), m - 1)) if e - s > 20 * m else []
            levels = [first * (ratio / first) ** (k / max(1, m - 1)) for k in range(m)]
            stages = [(b, lv) for b, lv in zip([s] + bounds, levels)]
        events.append({"start": s, "end": e, "ratio": round(ratio, 4), "shape": shape,
                       "stages": [[b, round(lv, 4)] for b, lv in stages]})
    return events


def make_trace(rng, kind, idx):
    n = rng.randint(1000, 4000)
    base = math.exp(rng.uniform(math.log(0.05), math.log(60.0)))
    cov = rng.uniform(0.02, 0.05) if kind == "hard" else rng.uniform(0.005, 0.03)
    family = rng.choice(FAMILIES)
    noise = Noise(rng, family, cov)
    effects, every = benign_effects(rng, n)
    events = fail_slows(rng, kind, n)
    slow = [1.0] * n
    label = [0] * n
    for ev in events:
        stages = ev["stages"] + [[ev["end"], None]]
        for (b, lv), (nb, _) in zip(stages, stages[1:]):
            for i in range(b, nb):
                slow[i] = lv
                label[i] = 1
    rows = [(i, base * math.exp(noise.draw()) * effects[i] * slow[i], label[i]) for i in range(n)]
    name = f"{idx:04d}-{kind}.csv"
    meta = {"kind": kind, "base_s": round(base, 4), "cov": round(cov, 4), "noise": family,
            "df": noise.df if family == "student_t" else None, "events": events,
            "failslow": [[ev["start"], ev["end"]] for ev in events], "checkpoint_every": every,
            "file": name, "iterations": n}
    return name, rows, meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=20250101)
    ap.add_argument("--per-kind", type=int, default=40)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    os.makedirs(a.out, exist_ok=True)
    index = []
    for k, kind in enumerate(["healthy", "compute", "comm", "hard"]):
        for j in range(a.per_kind):
            name, rows, meta = make_trace(rng, kind, k * a.per_kind + j)
            with open(os.path.join(a.out, name), "w") as f:
                f.write("iter,seconds,label\n")
                f.writelines(f"{i},{s:.6g},{lab}\n" for i, s, lab in rows)
            index.append(meta)
    with open(os.path.join(a.out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    print(f"wrote {len(index)} traces to {a.out}")


if __name__ == "__main__":
    main()
