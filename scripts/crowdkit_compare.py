#!/usr/bin/env python3
"""Compares jurystream's learned reviewer weights (contract §14) with
crowd-kit's reviewer skills on the same votes.

    scripts/crowdkit.sh compare VOTES.jsonl REPUTATION.json [--rubrics a,b]

(or this script run by the virtualenv's python, which has crowd-kit).
VOTES.jsonl is a vote log (contract §1), REPUTATION.json the output of
`jurystream reputation --format json` over it. The votes are binarised
(value >= 0.5 -> 1; abstentions, rejected lines and repeated vote ids
left out; a reviewer's last vote per item and rubric counts), and each
rubric is fitted on its own with crowd-kit's OneCoinDawidSkene (`skills_`)
and GLAD (`alphas_`), each item one task. Prints one JSON object: per
rubric and overall (every (reviewer, rubric) pair of the rubrics
compared), the number of reviewers and the Spearman rank correlation of
our `weight` with each skill; overall also over ranks taken within each
rubric (each model's skills have their own scale per rubric).
"""
import argparse
import json
import math
import sys

import pandas as pd
from crowdkit.aggregation import GLAD, OneCoinDawidSkene
from scipy.stats import spearmanr

STRINGS = {"pass": 1.0, "flag": 0.0, "fully": 1.0, "mostly": 0.9, "partial": 0.7, "minor": 0.3, "none": 0.0}


def value(v):
    """A vote's value on [0, 1] (contract §1), or None (abstention or invalid)."""
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        return float(v) if 0.0 <= v <= 1.0 else None
    if isinstance(v, str):
        return STRINGS.get(v.lower())
    return None


def read_votes(path):
    seen = set()
    latest = {}  # (rubric, task, worker) -> (timestamp, label)
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            vid = rec.get("vote_id")
            if vid is not None:
                if vid in seen:
                    continue
                seen.add(vid)
            x = value(rec.get("vote"))
            if x is None:
                continue
            key = (str(rec["voter_prompt_id"]), str(rec["inference_id"]), str(rec["voter_id"]))
            ts = rec.get("timestamp", "")
            if key not in latest or ts >= latest[key][0]:
                latest[key] = (ts, 1 if x >= 0.5 else 0)
    rows = {}
    for (rubric, task, worker), (_, label) in latest.items():
        rows.setdefault(rubric, []).append((task, worker, label))
    return {r: pd.DataFrame(v, columns=["task", "worker", "label"]) for r, v in rows.items()}


def spearman(a, b):
    if len(a) < 3:
        return None
    rho = spearmanr(a, b).statistic
    return None if rho is None or math.isnan(rho) else float(rho)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("votes")
    ap.add_argument("reputation")
    ap.add_argument("--rubrics", default="", help="comma-separated rubrics to compare (default: all)")
    a = ap.parse_args()
    frames = read_votes(a.votes)
    rep = json.load(open(a.reputation))
    weights = {(v["voter_prompt_id"], v["voter_id"]): v["weight"] for v in rep["voters"]}
    rubrics = [r for r in a.rubrics.split(",") if r] or sorted(frames)
    out = {"rubrics": {}, "overall": {}}
    pooled = {"weight": [], "one_coin_ds": [], "glad": []}
    raw = {"weight": [], "one_coin_ds": [], "glad": []}
    for rubric in rubrics:
        df = frames.get(rubric)
        if df is None:
            print(f"no votes on rubric {rubric}", file=sys.stderr)
            sys.exit(1)
        skills = OneCoinDawidSkene(n_iter=100).fit(df).skills_
        alphas = GLAD(n_iter=100, silent=True).fit(df).alphas_
        workers = sorted(w for w in skills.index if (rubric, w) in weights)
        ours = [weights[(rubric, w)] for w in workers]
        ds = [float(skills[w]) for w in workers]
        gl = [float(alphas[w]) for w in workers]
        for name, xs in (("weight", ours), ("one_coin_ds", ds), ("glad", gl)):
            raw[name].extend(xs)
            # Each model's skills have their own scale per rubric: ranks
            # within the rubric, as fractions, compare orderings only.
            ranks = pd.Series(xs).rank().tolist()
            pooled[name].extend(r / len(xs) for r in ranks)
        out["rubrics"][rubric] = {
            "reviewers": len(workers),
            "spearman_one_coin_ds": spearman(ours, ds),
            "spearman_glad": spearman(ours, gl),
            "weights": {w: [round(o, 4), round(d, 4), round(g, 4)] for w, o, d, g in zip(workers, ours, ds, gl)},
        }
    out["overall"] = {
        "pairs": len(raw["weight"]),
        "spearman_one_coin_ds": spearman(raw["weight"], raw["one_coin_ds"]),
        "spearman_glad": spearman(raw["weight"], raw["glad"]),
        "within_rubric_ranks_spearman_one_coin_ds": spearman(pooled["weight"], pooled["one_coin_ds"]),
        "within_rubric_ranks_spearman_glad": spearman(pooled["weight"], pooled["glad"]),
    }
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
