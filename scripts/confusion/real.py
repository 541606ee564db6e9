#!/usr/bin/env python3
"""Real public crowd data sets: the online models (model.py) in the review-
session layout against crowd-kit batch baselines.

    python real.py [DATA_DIR] [--seeds 1,2,3] [--variants a,b] [--no-crowdkit]

DATA_DIR (default /tmp/proto/data) holds product_answer.csv,
product_truth.csv, emotion_answer.csv, emotion_truth.csv,
bluebirds_gt.yaml, bluebirds_labels.yaml (README.md says where from).
Prints one line per (data set, method): the value per layout seed and
min-max; binary sets in % accuracy, emotion in MAE.
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


def encode(tasks, workers, values, truth_map):
    t_codes, t_uniq = pd.factorize(pd.Series(tasks).astype(str))
    w_codes, w_uniq = pd.factorize(pd.Series(workers).astype(str))
    truth = np.array([truth_map.get(t, np.nan) for t in t_uniq], dtype=float)
    return dict(item=t_codes, worker=w_codes, x=np.asarray(values, dtype=float),
                n_items=len(t_uniq), n_workers=len(w_uniq), truth=truth,
                tasks=np.asarray(t_uniq), workers=np.asarray(w_uniq))


def load_product(d):
    ans = pd.read_csv(os.path.join(d, "product_answer.csv"))
    tr = pd.read_csv(os.path.join(d, "product_truth.csv"))
    tm = dict(zip(tr["question"].astype(str), tr["truth"].astype(float)))
    return encode(ans["question"], ans["worker"], ans["answer"].astype(float), tm)


def load_emotion(d):
    ans = pd.read_csv(os.path.join(d, "emotion_answer.csv"))
    tr = pd.read_csv(os.path.join(d, "emotion_truth.csv"))
    tm = dict(zip(tr["question"].astype(str), (tr["truth"].astype(float) + 100) / 200))
    return encode(ans["question"], ans["worker"], (ans["answer"].astype(float) + 100) / 200, tm)


def load_bluebirds(d):
    import yaml
    with open(os.path.join(d, "bluebirds_gt.yaml")) as f:
        gt = yaml.safe_load(f)
    with open(os.path.join(d, "bluebirds_labels.yaml")) as f:
        lab = yaml.safe_load(f)
    tasks, workers, vals = [], [], []
    for w, items in lab.items():
        for t, v in items.items():
            tasks.append(str(t))
            workers.append(str(w))
            vals.append(1.0 if v else 0.0)
    tm = {str(t): (1.0 if v else 0.0) for t, v in gt.items()}
    return encode(tasks, workers, vals, tm)


LOADERS = dict(product=load_product, bluebirds=load_bluebirds, emotion=load_emotion)
BINARY = dict(product=True, bluebirds=True, emotion=False)


def crowdkit_scores(D):
    """Batch crowd-kit accuracy (%) on all votes at once, labels binarised at 0.5."""
    from crowdkit.aggregation import GLAD, DawidSkene, MajorityVote, OneCoinDawidSkene
    df = pd.DataFrame(dict(task=D["item"], worker=D["worker"], label=(D["x"] >= 0.5).astype(int)))
    out = {}
    for name, mk in [("crowdkit MV", lambda: MajorityVote()),
                     ("crowdkit DS", lambda: DawidSkene(n_iter=100)),
                     ("crowdkit OneCoinDS", lambda: OneCoinDawidSkene(n_iter=100)),
                     ("crowdkit GLAD", lambda: GLAD())]:
        t0 = time.time()
        lab = mk().fit_predict(df)
        pred = np.full(D["n_items"], np.nan)
        pred[lab.index.values.astype(int)] = lab.values.astype(float)
        ok = ~np.isnan(D["truth"]) & ~np.isnan(pred)
        out[name] = (100 * float(np.mean(pred[ok] == D["truth"][ok])), time.time() - t0)
    return out


def evaluate(D, binary, seeds, variants):
    res = {}
    for v in variants:
        vals = []
        for seed in seeds:
            times = model.layout_times(D["n_items"], seed)
            S = model.run(D["item"], D["worker"], D["x"], times, D["n_items"], D["n_workers"],
                          truth=D["truth"], **model.VARIANTS[v])
            vals.append(100 * model.accuracy(S, D["truth"]) if binary else model.mae(S, D["truth"]))
        res[v] = vals
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default="/tmp/proto/data")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--variants", default=",".join(model.VARIANTS))
    ap.add_argument("--sets", default="product,bluebirds,emotion")
    ap.add_argument("--no-crowdkit", action="store_true")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    variants = args.variants.split(",")
    allres = {}
    for name in args.sets.split(","):
        D = LOADERS[name](args.data)
        binary = BINARY[name]
        print(f"## {name}: {D['n_items']} items, {len(D['x'])} votes, {D['n_workers']} workers, "
              f"truth known for {int(np.sum(~np.isnan(D['truth'])))}", flush=True)
        if binary:
            S = model.run(D["item"], D["worker"], D["x"], model.layout_times(D["n_items"], 1),
                          D["n_items"], D["n_workers"], method="unweighted")
            print(f"   tie rule: S>=0.5 {100*model.accuracy(S, D['truth'], '>='):.2f}  "
                  f"S>0.5 {100*model.accuracy(S, D['truth'], '>'):.2f}")
        res = evaluate(D, binary, seeds, variants)
        fmt = (lambda v: f"{v:.1f}") if binary else (lambda v: f"{v:.4f}")
        for v, vals in res.items():
            print(f"   {v:24s} " + " ".join(fmt(a) for a in vals) +
                  f"   min-max {fmt(min(vals))}-{fmt(max(vals))}", flush=True)
        allres[name] = res
        if binary and not args.no_crowdkit:
            ck = crowdkit_scores(D)
            for k, (acc, dt) in ck.items():
                print(f"   {k:24s} {acc:.1f}   ({dt:.1f}s)", flush=True)
                allres[name][k] = [acc]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(allres, f, indent=1)


if __name__ == "__main__":
    main()
