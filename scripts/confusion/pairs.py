#!/usr/bin/env python3
"""Experiment: a confusion table fitted to per-pair co-vote counts.

    python pairs.py [--pops a,b] [--seeds 1,2,3] [--ck planted_ck.json]
                    [--real DATA_DIR] [--n0c 10] [--iters 100]
                    [--anchor none|start|hold|hybrid]
                    [--target anchor|own|mixed]

Not what the engine does (that is model.py's `mom` reference, section 15 of
docs/contract.md); this measures the candidate next reference, which needs
state the engine does not keep: per (rubric, epoch) and per ordered pair of
reviewers (j, k) that voted on the same unit, the integer counts
K[j, k, v_j, v_k] of their 0/1 votes (units whose votes are all 0 or 1 and
m >= 2; every ordered pair of distinct votes of a unit adds 1).

The table of epoch e sums the counts of epochs <= e - 2 and fits the
two-class model to them by pairwise (composite-likelihood) EM, treating
every co-vote as an independent pair observation of one latent class:

  start   se_j = sp_j = 0.8, pi = 0.5 (the same every epoch: no state);
          with --anchor start (the default) or hold, when the rubric's
          agreement moments identify (x, y, pi) (model.moments_rates,
          guard z = 1): se_j = x, sp_j = 1 - y and pi there. Pairs alone
          give two moments, M1 and M2, for three unknowns, so they do not
          identify a crowd of alike reviewers; triples do.
  E-step  g = pi P1 / (pi P1 + (1 - pi) P0) per (j, k, v_j, v_k), with
          P1 = P(v_j | 1) P(v_k | 1), P0 = P(v_j | 0) P(v_k | 0)
  M-step  pi = sum K g / sum K (kept at the moments' pi with --anchor
          hold); per reviewer j, over its pairs: n1 = sum K g,
          U = sum K g [v_j = 1], n0 = sum K (1 - g), V = sum K (1 - g)
          [v_j = 0]; the rubric's rates se_R = sum U / sum n1,
          sp_R = sum V / sum n0; the reviewer's balanced accuracy
          acc_j = ((U + n0c se_R)/(n1 + n0c) + (V + n0c sp_R)/(n0 + n0c))/2;
          then se_j = (U + n0c t_se)/(n1 + n0c), sp_j = (V + n0c t_sp)/
          (n0 + n0c), both clamped to [0.02, 0.98] (n0c counts pair
          observations, 10 by default: a vote in a unit of m adds m - 1
          of them). The target (t_se, t_sp), --target:
            anchor (the default): the moments' (x, 1 - y) when they
                    identify them, else (acc_j, acc_j);
            own:    (acc_j, acc_j) always: one coin while a reviewer's
                    votes are few, two as they grow;
            mixed:  halfway between (acc_j, acc_j) and (se_R, sp_R)
  iters   a fixed number of rounds (100 by default), so the table is a
          function of the counts alone

--anchor hybrid: the built model's moment table (model.conf_table_mom,
with the majority guard and cap) where the moments identify the rates,
the pair table otherwise.

Side weights, scale s, the prior pseudo-vote (capped at M = 10 like the side
weights), unseen reviewers at the rubric's rates and the majority guard are
those of the contract; scoring is model.py's.

Planted populations are compared with crowd-kit's numbers from a result
file of `planted.py --json` (--ck); real data sets (--real) with the
unweighted mean on the same layouts.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402

EPS, N0C, CAP = model.EPS, model.N0C, 10.0
N0C_PAIRS = 10.0  # the reviewers' shrinkage, in pair observations


def pair_counts(item, worker, x, ep_item, n_workers):
    """Per epoch: K (W, W, 2, 2) pair counts, c (W) votes in counted units and
    the rubric's moment sums (N, P, A, T3, C3) of contract section 15."""
    W, E = n_workers, int(ep_item.max()) + 1
    by_item = {}
    for i, w, v in zip(item, worker, x):
        by_item.setdefault(int(i), []).append((int(w), float(v)))
    K = [np.zeros((W, W, 2, 2)) for _ in range(E)]
    C = [np.zeros(W) for _ in range(E)]
    M = np.zeros((E, 5))
    R = [np.zeros((5, W)) for _ in range(E)]  # per reviewer p, a, b, t3, c3
    for i, vs in by_item.items():
        m = len(vs)
        if m < 2 or any(v not in (0.0, 1.0) for _, v in vs):
            continue
        e, total = ep_item[i], sum(v for _, v in vs)
        for a, (wa, va) in enumerate(vs):
            C[e][wa] += 1
            o = (total - va) / (m - 1)
            M[e, :3] += (1.0, o, o * va)
            R[e][:3, wa] += (o, o * va, (1 - o) * (1 - va))
            if m >= 3:
                so = total - va  # 0/1 values: the others' sum of squares is so too
                M[e, 3:] += (va * (so * so - so) / ((m - 1) * (m - 2)), 1.0)
                R[e][3:, wa] += (va * (so * so - so) / ((m - 1) * (m - 2)), 1.0)
            for b, (wb, vb) in enumerate(vs):
                if a != b:
                    K[e][wa, wb, int(va), int(vb)] += 1
    return K, C, M, R, by_item


def pair_em(K, iters, n0c, anchor=None, hold=False, target="anchor"):
    """(se, sp, pi, se_R, sp_R) fitted to pair counts K by pairwise EM.

    Each reviewer's se and sp are shrunk by n0c towards the reviewer's own
    balanced accuracy (the mean of se and sp shrunk towards the rubric's
    rates): a one-coin reviewer while the votes are few, two coins as they
    grow. anchor: (x, y, pi) from the agreement moments; every reviewer
    starts at se = x, sp = 1 - y and pi there; hold: pi stays there.
    target "anchor": towards the anchor's (x, 1 - y) when there is one,
    else as "own"; "mixed": halfway between that accuracy and the rubric's
    rates."""
    W = K.shape[0]
    se, sp, pi = np.full(W, 0.8), np.full(W, 0.8), 0.5
    if anchor is not None:
        se, sp, pi = np.full(W, anchor[0]), np.full(W, 1 - anchor[1]), anchor[2]
    seR = spR = 0.8
    for _ in range(iters):
        P1 = np.stack([1 - se, se], -1)
        P0 = np.stack([sp, 1 - sp], -1)
        L1 = P1[:, None, :, None] * P1[None, :, None, :]
        L0 = P0[:, None, :, None] * P0[None, :, None, :]
        g = pi * L1 / (pi * L1 + (1 - pi) * L0)
        G1 = K * g
        G0 = K - G1
        t1, t0 = G1.sum(axis=(1, 3)), G0.sum(axis=(1, 3))
        n1, U, n0, V = t1.sum(1), t1[:, 1], t0.sum(1), t0[:, 0]
        if anchor is None or not hold:
            pi = G1.sum() / K.sum()
        if not (n1.sum() > 0 and n0.sum() > 0):
            break
        seR, spR = U.sum() / n1.sum(), V.sum() / n0.sum()
        acc = ((U + n0c * seR) / (n1 + n0c) + (V + n0c * spR) / (n0 + n0c)) / 2
        if target == "anchor" and anchor is not None:
            tse, tsp = anchor[0], 1 - anchor[1]
        elif target in ("own", "anchor"):
            tse, tsp = acc, acc
        else:
            tse, tsp = (acc + seR) / 2, (acc + spR) / 2
        se = np.clip((U + n0c * tse) / (n1 + n0c), EPS, 1 - EPS)
        sp = np.clip((V + n0c * tsp) / (n0 + n0c), EPS, 1 - EPS)
    return se, sp, pi, min(max(seR, EPS), 1 - EPS), min(max(spR, EPS), 1 - EPS)


def table(K, c, iters, n0c, anchor=None, hold=False, target="anchor"):
    """Side weights as the contract builds them from (se, sp, pi); None when empty."""
    N = c.sum()
    if not N > 0:
        return None
    se, sp, pi, seR, spR = pair_em(K, iters, n0c, anchor, hold, target)
    if not 0 < pi < 1 or not c[se + sp > 1].sum() * 2 > N:  # the majority guard
        return None
    lp, lm = np.log(se / (1 - sp)), np.log(sp / (1 - se))
    s = float(np.sum(c * (pi * np.maximum(lp, 0) + (1 - pi) * np.maximum(lm, 0))) / N)
    if not s > 0:
        return None
    seen = c > 0
    wp = np.clip(np.where(seen, lp, math.log(seR / (1 - spR))) / s, -CAP, CAP)
    wm = np.clip(np.where(seen, lm, math.log(spR / (1 - seR))) / s, -CAP, CAP)
    pi1 = (N * pi + N0C / 2) / (N + N0C)
    w0 = min(abs(math.log(pi1 / (1 - pi1))) / s, CAP)
    return dict(wp=wp, wm=wm, w0=w0, v0=1.0 if pi1 > 0.5 else 0.0)


def mom_table(c, R, mr):
    """The built model's moment table (guard and cap as the contract's)."""
    t = model.conf_table_mom(c, R[0], R[1], R[2], R[3], R[4], cap=CAP, zmin=1.0)
    if t is None:
        return None
    N = c.sum()
    # majority guard: the values of reviewers with se_u + sp_u > 1 (wp + wm > 0) must be most
    if not c[(t["wp"] + t["wm"] > 0) & (c > 0)].sum() * 2 > N:
        return None
    w0 = min(abs(math.log(t["pi1"] / (1 - t["pi1"]))) / t["s"], CAP)
    return dict(wp=t["wp"], wm=t["wm"], w0=w0, v0=1.0 if t["pi1"] > 0.5 else 0.0)


def run(D, times, iters=100, n0c=None, anchor="start", target="anchor"):
    """S per item: each item one batch, scored with the table of epochs <= k - 2.

    anchor: "none", "start" (EM starts at the agreement moments' solution
    when they identify it: model.moments_rates, guard z = 1) or "hold"
    (starts there and keeps their pi) or "hybrid" (the moment table there,
    the pair table elsewhere). target: see pair_em."""
    n0c = N0C_PAIRS if n0c is None else n0c
    ep_item = np.floor(np.asarray(times) / model.EPOCH).astype(int)
    Kep, Cep, Mep, Rep, by_item = pair_counts(D["item"], D["worker"], D["x"], ep_item,
                                         D["n_workers"])
    W = D["n_workers"]
    K, c, M, R = np.zeros((W, W, 2, 2)), np.zeros(W), np.zeros(5), np.zeros((5, W))
    S = np.full(D["n_items"], np.nan)
    for k in range(len(Kep)):
        if k >= model.LAG:
            K += Kep[k - model.LAG]
            c += Cep[k - model.LAG]
            M += Mep[k - model.LAG]
            R += Rep[k - model.LAG]
        mr = model.moments_rates(*M, zmin=1.0) if anchor != "none" and M[0] > 0 else None
        if anchor == "hybrid" and mr is not None:
            tab = mom_table(c, R, mr)
        else:
            tab = table(K, c, iters, n0c, mr, anchor == "hold", target)
        for i in np.flatnonzero(ep_item == k):
            vs = by_item.get(int(i), [])
            if not vs:
                continue
            binary = all(v in (0.0, 1.0) for _, v in vs)
            if tab is None or not binary:  # graded batches: see model.py (unweighted here)
                num, den, sw = sum(v for _, v in vs), float(len(vs)), float(len(vs))
            else:
                num = den = 0.0
                for w, v in vs:
                    ws = tab["wp"][w] if v == 1.0 else tab["wm"][w]
                    num += abs(ws) * (v if ws >= 0 else 1.0 - v)
                    den += abs(ws)
                sw = den
                num += tab["w0"] * tab["v0"]
                den += tab["w0"]
            a = num / den if den > 0 else model.S0
            beta = (1 - model.ALPHA) * min(1.0, sw / len(vs))
            S[i] = (1 - beta) * model.S0 + beta * a
    return S


def main():
    import planted
    ap = argparse.ArgumentParser()
    ap.add_argument("--pops", default=",".join(planted.POPS))
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--ck", help="planted.py --json result file with crowd-kit's numbers")
    ap.add_argument("--real", metavar="DATA_DIR", help="also product and bluebirds (real.py)")
    ap.add_argument("--n0c", type=float, default=N0C_PAIRS)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--anchor", choices=("none", "start", "hold", "hybrid"), default="start",
                    help="where EM starts / whether pi stays at the agreement moments")
    ap.add_argument("--target", choices=("anchor", "own", "mixed"), default="anchor",
                    help="what a reviewer's rates are shrunk towards (see pair_em)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    ck = {}
    if args.ck:
        with open(args.ck) as f:
            ck = json.load(f)
    for pop in filter(None, args.pops.split(",")):
        for seed in seeds:
            D = planted.generate(pop, seed)
            t0 = time.time()
            acc = 100 * model.accuracy(run(D, D["times"], args.iters, args.n0c, args.anchor, args.target), D["truth"])
            r = {k: d.get(str(seed)) for k, d in ck.get(pop, {}).items()}
            ref = "".join(f" {k} {r[k]:.1f}" for k in ("unweighted", "ck GLAD", "ck DS")
                          if r.get(k) is not None)
            bar = [r[k] - (2 if k == "ck DS" else 0) for k in ("unweighted", "ck GLAD", "ck DS")
                   if r.get(k) is not None]
            miss = " (below a bar)" if bar and acc < max(bar) else ""
            print(f"{pop:18s} {seed} pairs {acc:.1f}{miss} |{ref}  {time.time() - t0:.0f}s",
                  flush=True)
    if args.real:
        import real
        for name, load in (("bluebirds", real.load_bluebirds), ("product", real.load_product)):
            D = load(args.real)
            for seed in seeds:
                times = model.layout_times(D["n_items"], seed)
                acc = 100 * model.accuracy(run(D, times, args.iters, args.n0c, args.anchor, args.target), D["truth"])
                S = model.run(D["item"], D["worker"], D["x"], times, D["n_items"],
                              D["n_workers"], method="unweighted")
                print(f"{name:18s} {seed} pairs {acc:.1f} | unweighted "
                      f"{100 * model.accuracy(S, D['truth']):.1f}", flush=True)


if __name__ == "__main__":
    main()
