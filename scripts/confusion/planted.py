#!/usr/bin/env python3
"""Planted populations: generated binary votes with known reviewer types,
scored by the online models (model.py) in the review-session layout and by
crowd-kit batch aggregators on the same votes.

    python planted.py [--seeds 1,2,3] [--pops name,...] [--variants a,b]
                      [--no-crowdkit] [--json OUT]
    python planted.py --report OUT.json [MORE.json ...]   # markdown tables

Class 1 = "pass"; pi = share of class 1 (pi < 0.5: passes are rare,
pi > 0.5: flags are rare). Each population: 2 000 items, 3-5 reviewers per
item drawn from a pool of 30, one batch per item at a uniform time over
168 h. A seed fixes the reviewers, the truth, the votes and the layout.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402

N_ITEMS = 2000
POOL = 30


def reviewer(kind, rng):
    """(se, sp) of one reviewer: P(vote 1 | class 1), P(vote 0 | class 0)."""
    if kind in ("honest", "minority"):
        return rng.uniform(0.85, 0.95), rng.uniform(0.85, 0.95)
    if kind == "lenient":
        return rng.uniform(0.96, 0.99), rng.uniform(0.3, 0.5)
    if kind == "harsh":
        return rng.uniform(0.3, 0.5), rng.uniform(0.96, 0.99)
    if kind == "spam":
        return 0.5, 0.5
    if kind == "pass":  # always-pass spammer
        return 1.0, 0.0
    if kind == "adversary":
        return rng.uniform(0.15, 0.25), rng.uniform(0.15, 0.25)
    raise ValueError(kind)


# name -> (pi, {kind: count}); counts sum to POOL
POPS = {
    "honest pi=.05": (0.05, dict(honest=30)),
    "honest pi=.12": (0.12, dict(honest=30)),
    "honest pi=.30": (0.30, dict(honest=30)),
    "honest pi=.50": (0.50, dict(honest=30)),
    "honest pi=.95": (0.95, dict(honest=30)),
    "len+harsh pi=.12": (0.12, dict(honest=10, lenient=10, harsh=10)),
    "len+harsh pi=.88": (0.88, dict(honest=10, lenient=10, harsh=10)),
    "harsh30% pi=.40": (0.40, dict(honest=21, harsh=9)),
    "harsh50% pi=.30": (0.30, dict(honest=15, harsh=15)),
    "harsh50% pi=.50": (0.50, dict(honest=15, harsh=15)),
    "lenient50% pi=.12": (0.12, dict(honest=15, lenient=15)),
    "lenient50% pi=.50": (0.50, dict(honest=15, lenient=15)),
    "lenient50% pi=.70": (0.70, dict(honest=15, lenient=15)),
    "spam+adv pi=.05": (0.05, dict(honest=16, spam=4, **{"pass": 4}, adversary=6)),
    "spam+adv pi=.30": (0.30, dict(honest=16, spam=4, **{"pass": 4}, adversary=6)),
    "spam+adv pi=.95": (0.95, dict(honest=16, spam=4, **{"pass": 4}, adversary=6)),
    "minority pi=.30": (0.30, dict(honest=21, minority=9)),
    "minority pi=.70": (0.70, dict(honest=21, minority=9)),
}


def generate(pop, seed):
    pi, counts = POPS[pop]
    rng = np.random.default_rng([seed, sum(map(ord, pop))])
    kinds = [k for k, n in counts.items() for _ in range(n)]
    rng.shuffle(kinds)
    se_sp = np.array([reviewer(k, rng) for k in kinds])
    minority = np.array([k == "minority" for k in kinds])
    truth = (rng.random(N_ITEMS) < pi).astype(float)
    contentious = rng.random(N_ITEMS) < 0.30
    items, workers = [], []
    for i in range(N_ITEMS):
        m = rng.integers(3, 6)
        ws = rng.choice(POOL, size=m, replace=False)
        items.extend([i] * m)
        workers.extend(ws)
    item = np.array(items)
    worker = np.array(workers)
    t = truth[item]
    p1 = np.where(t == 1, se_sp[worker, 0], 1 - se_sp[worker, 1])
    x = (rng.random(len(item)) < p1).astype(float)
    x = np.where(minority[worker] & contentious[item], 0.0, x)
    times = rng.uniform(0.0, 168 * 3600.0, size=N_ITEMS)
    return dict(item=item, worker=worker, x=x, truth=truth, times=times,
                n_items=N_ITEMS, n_workers=POOL)


def crowdkit_acc(D):
    from crowdkit.aggregation import GLAD, DawidSkene, MajorityVote, OneCoinDawidSkene
    df = pd.DataFrame(dict(task=D["item"], worker=D["worker"], label=D["x"].astype(int)))
    out = {}
    for name, mk in [("ck MV", lambda: MajorityVote()),
                     ("ck DS", lambda: DawidSkene(n_iter=100)),
                     ("ck OneCoinDS", lambda: OneCoinDawidSkene(n_iter=100)),
                     ("ck GLAD", lambda: GLAD())]:
        lab = mk().fit_predict(df)
        pred = np.full(D["n_items"], np.nan)
        pred[lab.index.values.astype(int)] = lab.values.astype(float)
        out[name] = 100 * float(np.mean(pred == D["truth"]))
    return out


def mm(d, seeds):
    vals = [d[str(s)] for s in seeds if str(s) in d]
    if not vals:
        return "-"
    return f"{min(vals):.1f}" if max(vals) - min(vals) < 0.05 else f"{min(vals):.1f}-{max(vals):.1f}"


def bars(res, v, seeds, agg=min):
    """Per population, agg over seeds of the margin of variant v over each bar
    (agg=min: the worst seed; a mean over seeds is passed as agg=np.mean)."""
    out = {}
    for pop, r in res.items():
        if v not in r:
            continue
        m = {}
        for bar, base, slack in (("unw", "unweighted", 0.0), ("GLAD", "ck GLAD", 0.0),
                                 ("DS-2", "ck DS", 2.0)):
            if base not in r or base == v:
                continue
            diffs = [r[v][str(s)] - r[base][str(s)] + slack for s in seeds
                     if str(s) in r[v] and str(s) in r[base]]
            if diffs:
                m[bar] = float(agg(diffs))
        out[pop] = m
    return out


def bar_table(res, methods, seeds, agg, title):
    print(title + "\n")
    print("| variant | fails unw | fails GLAD | fails DS-2 | worst margin unw / GLAD / DS-2 | failures |")
    print("|---|---|---|---|---|---|")
    for k in methods:
        b = bars(res, k, seeds, agg)
        f = {bar: [p for p, m in b.items() if bar in m and m[bar] < -1e-9] for bar in ("unw", "GLAD", "DS-2")}
        worst = {bar: min((m[bar] for m in b.values() if bar in m), default=float("nan"))
                 for bar in ("unw", "GLAD", "DS-2")}
        fl = "; ".join(f"{bar}: " + ", ".join(ps) for bar, ps in f.items() if ps)
        print(f"| {k} | {len(f['unw'])} | {len(f['GLAD'])} | {len(f['DS-2'])} | "
              f"{worst['unw']:+.1f} / {worst['GLAD']:+.1f} / {worst['DS-2']:+.1f} | {fl} |")
    print()


def report(res, seeds, key_methods):
    pops = list(res)
    methods = []
    for r in res.values():
        methods += [m for m in r if m not in methods]
    methods = [m for m in methods if not m.startswith("ck ")] + [m for m in methods if m.startswith("ck ")]
    print("### Accuracy (%) per population, min-max over seeds " + ",".join(map(str, seeds)) + "\n")
    print("| population | " + " | ".join(key_methods) + " |")
    print("|---" * (len(key_methods) + 1) + "|")
    for pop in pops:
        print(f"| {pop} | " + " | ".join(mm(res[pop].get(k, {}), seeds) for k in key_methods) + " |")
    print("\n### Every variant (min-max over seeds)\n")
    for i in range(0, len(pops), 6):
        chunk = pops[i:i + 6]
        print("| method | " + " | ".join(chunk) + " |")
        print("|---" * (len(chunk) + 1) + "|")
        for k in methods:
            print(f"| {k} | " + " | ".join(mm(res[p].get(k, {}), seeds) for p in chunk) + " |")
        print()
    bar_table(res, methods, seeds, np.mean,
              "### Bars, mean over seeds: populations where the variant is below unweighted, "
              "below GLAD, below DS - 2")
    bar_table(res, methods, seeds, min, "### Bars, worst seed (same votes compared seed by seed)")


KEY = ["unweighted", "noise", "mean+inv", "fed", "fed/check2", "mom+inv/z1", "hyb/z1/wmean",
       "ck MV", "ck DS", "ck OneCoinDS", "ck GLAD"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", nargs="+", metavar="JSON",
                    help="only print markdown tables from these result files (merged)")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--pops", default=",".join(POPS))
    ap.add_argument("--variants", default=",".join(model.VARIANTS))
    ap.add_argument("--no-crowdkit", action="store_true")
    ap.add_argument("--json", help="write {pop: {method: [acc per seed]}} here")
    ap.add_argument("--merge", help="start from this JSON (e.g. earlier crowd-kit results)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.report:
        res = {}
        for path in args.report:
            with open(path) as f:
                for pop, r in json.load(f).items():
                    for k, d in r.items():
                        res.setdefault(pop, {}).setdefault(k, {}).update(d)
        report(res, seeds, KEY)
        return
    res = {}
    if args.merge:
        with open(args.merge) as f:
            res = json.load(f)
    for pop in args.pops.split(","):
        r = res.setdefault(pop, {})
        t0 = time.time()
        for seed in seeds:
            D = generate(pop, seed)
            for v in args.variants.split(","):
                S = model.run(D["item"], D["worker"], D["x"], D["times"], D["n_items"],
                              D["n_workers"], truth=D["truth"], **model.VARIANTS[v])
                r.setdefault(v, {})[str(seed)] = 100 * model.accuracy(S, D["truth"])
            if not args.no_crowdkit:
                for k, acc in crowdkit_acc(D).items():
                    r.setdefault(k, {})[str(seed)] = acc
        print(f"## {pop}  ({time.time() - t0:.1f}s)", flush=True)
        for k, d in r.items():
            vals = [d[str(s)] for s in seeds if str(s) in d]
            if vals:
                print(f"   {k:24s} " + " ".join(f"{a:.1f}" for a in vals) +
                      f"   min-max {min(vals):.1f}-{max(vals):.1f}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
