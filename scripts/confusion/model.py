"""Online reviewer-reputation models as pure functions over per-reviewer sums.

Shared by real.py (public crowd data sets) and planted.py (generated
populations). Nothing here reads files.

Votes are given as parallel numpy arrays (item, worker, value) with values
on [0, 1]; `item_time` gives each item's batch time in seconds. Each item is
one batch and one unit; epoch(t) = floor(t / 3600); a batch in epoch k is
scored with the table built from the sums of every unit of epochs <= k - 2.

Methods (see README.md for the formulas):
  unweighted      every weight 1, no prior
  noise           the section-14 noise model (omega per reviewer)
  conf            the class-conditional ("confusion") model; options:
      ref     'mean' (others' unweighted mean), 'fed' (others' posterior
              under the table in force for the unit's own epoch) or 'mom'
              (others' mean, rates de-attenuated by agreement moments)
      inv     True: a side worse than chance counts inverted; False: it
              counts for nothing
      unseen  'a': a reviewer with no units gets weight 1 on both sides;
              'b': the rubric's rates se_R, sp_R
      cap     None or a maximum |side weight|
      fed_mode  'post' (sigma(logit pi' + sum of others' raw evidence)) or
              'wmean' (the others' weighted mean exactly as in scoring)
      ref_noinv    fed reference clamps lambda >= 0
      ref_noprior  fed reference leaves the prior out
      graded  'batch' (default): confusion sums and weights only for batches
              whose votes are all 0 or 1, other batches keep omega; 'vote':
              per vote, 0/1 votes always get confusion weights
      zmin    'mom' reference: identification guard (see moments_rates)
      prior_scale  multiplies the prior pseudo-vote's weight (1 = as specified)
      truth   per-item truth, only for ref='truth' (the oracle reference:
              the true class in place of o_i; a ceiling, not a model)
      check   'se': the fed table is used only if it and the mean-reference
              table both have se_R + sp_R > 1; or a factor F: in epoch k the fed table is used (for
              scoring and for the reference) only if the unweighted-
              reference table has se_R + sp_R > 1 and the fed and
              unweighted base rates pi and 1 - pi agree within F;
              otherwise the unweighted-reference table and the others'
              mean are used.
"""
import math

import numpy as np

EPOCH = 3600.0
LAG = 2
ALPHA = math.exp(-0.01 * 3600.0)
S0 = 0.5
# noise model
N0 = 20.0
F_NOISE = 0.03
W_MIN, W_MAX = 0.2, 3.0
# confusion model
N0C = 5.0
EPS = 0.02


# ---------------------------------------------------------------- tables

def noise_weights(n, q, h):
    """omega per reviewer from the per-reviewer sums n, q, h (arrays)."""
    N, Q, H = n.sum(), q.sum(), h.sum()
    w = np.ones_like(n)
    if N <= 0 or Q <= 0:
        return w
    tau2 = Q / (N + H)
    sig2 = np.maximum(0.0, N0 * tau2 + q - tau2 * h) / (N0 + n)
    om = np.clip((tau2 + F_NOISE) / (sig2 + F_NOISE), W_MIN, W_MAX)
    return np.where(n > 0, om, 1.0)


def conf_table(c, p, a, b, unseen="a", cap=None, inv=True):
    """Side weights from the confusion sums.

    Returns None when the table is empty (every weight 1, no prior), else a
    dict with wp (weight of a pass, signed: < 0 means it counts as a flag),
    wm (weight of a flag, signed: < 0 means it counts as a pass), s (scale),
    pi, pi1 (prior pi'), se_R, sp_R.
    """
    N, P, A, B = c.sum(), p.sum(), a.sum(), b.sum()
    if N <= 0 or P <= 0 or N - P <= 0:
        return None
    pi = P / N
    seR = A / P
    spR = B / (N - P)
    se = np.clip((a + N0C * seR) / (p + N0C), EPS, 1 - EPS)
    sp = np.clip((b + N0C * spR) / (c - p + N0C), EPS, 1 - EPS)
    lp = np.log(se / (1 - sp))
    lm = np.log(sp / (1 - se))
    s = float(np.sum(c * (pi * np.maximum(lp, 0) + (1 - pi) * np.maximum(lm, 0))) / N)
    if not s > 0:
        return None
    wp, wm = lp / s, lm / s
    if unseen == "a":
        wp = np.where(c > 0, wp, 1.0)
        wm = np.where(c > 0, wm, 1.0)
    if not inv:
        wp, wm = np.maximum(wp, 0), np.maximum(wm, 0)
    if cap is not None:
        wp, wm = np.clip(wp, -cap, cap), np.clip(wm, -cap, cap)
    pi1 = (P + N0C / 2) / (N + N0C)
    return dict(wp=wp, wm=wm, s=s, pi=pi, pi1=pi1, seR=seR, spR=spR)


def moments_rates(N, P, A, T3, C3, zmin=0.0):
    """Rubric-level (se, 1 - sp, pi) from the first three agreement moments.

    M1 = E[v] = P/N, M2 = E[v_i v_j] = A/N (o = others' mean), M3 =
    E[v_i v_j v_k] = T3/C3 (units with >= 3 votes). Under conditionally
    independent, exchangeable reviewers M_r = pi x^r + (1 - pi) y^r with
    x = se, y = 1 - sp; x and y are the roots of z^2 - e1 z + e2 (Prony).
    The root with x > y is taken (se + sp > 1): no label switching.
    Returns None when the moments do not identify a valid solution, or when
    the inter-rater covariance M2 - M1^2 is small against its sampling
    noise: (M2 - M1^2) * sqrt(N) < zmin (the identification guard).
    """
    if N <= 0 or C3 <= 0:
        return None
    M1, M2, M3 = P / N, A / N, T3 / C3
    var = M2 - M1 * M1
    if not var > 1e-9 or var * math.sqrt(N) < zmin:
        return None
    e1 = (M3 - M1 * M2) / var
    e2 = (M1 * M3 - M2 * M2) / var
    disc = e1 * e1 - 4 * e2
    if not disc > 0:
        return None
    r = math.sqrt(disc)
    x, y = (e1 + r) / 2, (e1 - r) / 2
    if not (-0.05 <= y < x <= 1.05):
        return None
    x, y = min(max(x, EPS), 1 - EPS), min(max(y, EPS), 1 - EPS)
    if not x > y:
        return None
    pi = (M1 - y) / (x - y)
    if not 0.0 < pi < 1.0:
        return None
    return x, y, pi


def conf_table_mom(c, p, a, b, t3, c3, unseen="a", cap=None, inv=True, zmin=0.0):
    """Confusion table with the others'-mean reference de-attenuated by moments.

    The others' mean o of a class-1 unit averages x = se, of a class-0 unit
    y = 1 - sp (rubric rates from moments_rates). Per reviewer:
    n1 = clamp((p - c y)/(x - y), 0, c), n0 = c - n1 and the sums solve
        a = x U + y (n0 - V),   b = (1 - x)(n1 - U) + (1 - y) V
    for U = n1 se_u, V = n0 sp_u; se_u = (U + n0c x)/(n1 + n0c),
    sp_u = (V + n0c (1 - y))/(n0 + n0c). Falls back to conf_table when the
    moments do not identify the rates.
    """
    N, P, A = c.sum(), p.sum(), a.sum()
    mr = moments_rates(N, P, A, t3.sum(), c3.sum(), zmin)
    if mr is None:
        tab = conf_table(c, p, a, b, unseen, cap, inv)
        if tab is not None:
            tab["mom"] = False
        return tab
    x, y, pi = mr
    n1 = np.clip((p - c * y) / (x - y), 0, c)
    n0 = c - n1
    U = ((a - n0 * y) * (1 - y) + y * (b - n1 * (1 - x))) / (x - y)
    V = (x * (b - n1 * (1 - x)) + (1 - x) * (a - n0 * y)) / (x - y)
    U = np.clip(U, 0, n1)
    V = np.clip(V, 0, n0)
    se = np.clip((U + N0C * x) / (n1 + N0C), EPS, 1 - EPS)
    sp = np.clip((V + N0C * (1 - y)) / (n0 + N0C), EPS, 1 - EPS)
    lp = np.log(se / (1 - sp))
    lm = np.log(sp / (1 - se))
    s = float(np.sum(c * (pi * np.maximum(lp, 0) + (1 - pi) * np.maximum(lm, 0))) / N)
    if not s > 0:
        return None
    wp, wm = lp / s, lm / s
    if unseen == "a":
        wp = np.where(c > 0, wp, 1.0)
        wm = np.where(c > 0, wm, 1.0)
    if not inv:
        wp, wm = np.maximum(wp, 0), np.maximum(wm, 0)
    if cap is not None:
        wp, wm = np.clip(wp, -cap, cap), np.clip(wm, -cap, cap)
    pi1 = (N * pi + N0C / 2) / (N + N0C)
    return dict(wp=wp, wm=wm, s=s, pi=pi, pi1=pi1, seR=x, spR=1 - y, mom=True)


# ---------------------------------------------------------- per-vote maps

def conf_vote_weights(tab, worker, x, omega, batch_binary=None):
    """(value, weight, is_binary) per vote under a confusion table.

    batch_binary (per vote): the vote's batch has only 0/1 votes. When
    given, the confusion weights apply only in such batches and every vote
    of a batch with a graded value keeps the noise model's omega (graded
    mode 'batch'); when None, per vote: 0/1 votes get the confusion weights,
    values inside (0, 1) omega (graded mode 'vote').
    """
    binary = (x == 0.0) | (x == 1.0)
    if batch_binary is not None:
        if tab is None:
            return x.copy(), np.where(batch_binary, 1.0, omega[worker]), binary
        binary = binary & batch_binary
    elif tab is None:
        return x.copy(), np.ones_like(x), binary
    w_side = np.where(x == 1.0, tab["wp"][worker], tab["wm"][worker])
    val = np.where(binary, np.where(w_side >= 0, x, 1.0 - x), x)
    w = np.where(binary, np.abs(w_side), omega[worker])
    return val, w, binary


def group_sum(idx, vals, n):
    return np.bincount(idx, weights=vals, minlength=n)


# ------------------------------------------------------------------ runner

def run(item, worker, x, item_time, n_items, n_workers, method="conf", ref="mean", inv=True,
        unseen="a", cap=None, fed_mode="post", ref_noinv=False, ref_noprior=False, check=None,
        prior_scale=1.0, zmin=0.0, graded="batch", truth=None, return_info=False):
    """Scores every item once (its batch); returns S per item (nan if no votes)."""
    item = np.asarray(item)
    worker = np.asarray(worker)
    x = np.asarray(x, dtype=float)
    ep_item = np.floor(np.asarray(item_time) / EPOCH).astype(int)
    E = int(ep_item.max()) + 1
    ep_vote = ep_item[item]
    order = np.argsort(ep_vote, kind="stable")
    bounds = np.searchsorted(ep_vote[order], np.arange(E + 1))
    W = n_workers
    # running table sums (epochs <= k - 2) and per-epoch sums
    tot = {k: np.zeros(W) for k in ("n", "q", "h", "c", "p", "a", "b", "cf", "pf", "af", "bf",
                                    "t3", "c3")}
    per_epoch = [None] * E
    S = np.full(n_items, np.nan)
    info = dict(check_fail=0, check_epochs=0)
    for k in range(E):
        if k - LAG >= 0 and per_epoch[k - LAG] is not None:
            for key, v in per_epoch[k - LAG].items():
                tot[key] += v
        sl = order[bounds[k]:bounds[k + 1]]
        if len(sl) == 0:
            continue
        it, wk, xv = item[sl], worker[sl], x[sl]
        uit, loc = np.unique(it, return_inverse=True)
        ni = len(uit)
        m = np.bincount(loc, minlength=ni).astype(float)
        Ssum = group_sum(loc, xv, ni)
        mv = m[loc]
        unit = mv >= 2
        o_mean = np.where(unit, (Ssum[loc] - xv) / np.maximum(mv - 1, 1), 0.0)
        if ref == "truth":  # oracle: the true class as the reference (a ceiling, not a model)
            o_mean = np.where(unit, np.asarray(truth, dtype=float)[it], 0.0)
        allbin_item = group_sum(loc, ((xv == 0.0) | (xv == 1.0)).astype(float), ni) == m
        omega = noise_weights(tot["n"], tot["q"], tot["h"])

        # --- table in force and the unit reference
        tab_unw = None
        tab = None
        use_fed = False
        if method == "conf":
            if ref == "mom":
                tab_unw = conf_table_mom(tot["c"], tot["p"], tot["a"], tot["b"], tot["t3"], tot["c3"],
                                         unseen, cap, inv, zmin)
                info["check_epochs"] += 1
                info["check_fail"] += int(tab_unw is None or not tab_unw["mom"])
            elif ref == "hyb":
                tab_m = conf_table_mom(tot["c"], tot["p"], tot["a"], tot["b"], tot["t3"], tot["c3"],
                                       unseen, cap, inv, zmin)
                if tab_m is not None and tab_m["mom"]:
                    tab_unw = tab_m
                else:
                    tab_unw = conf_table(tot["c"], tot["p"], tot["a"], tot["b"], unseen, cap, inv)
            else:
                tab_unw = conf_table(tot["c"], tot["p"], tot["a"], tot["b"], unseen, cap, inv)
            if ref == "hyb" and tab_unw is not None and tab_unw.get("mom"):
                tab = tab_unw
                use_fed = True  # fed sums: posterior under the moment table
            elif ref in ("fed", "hyb"):
                tab_fed = conf_table(tot["cf"], tot["pf"], tot["af"], tot["bf"], unseen, cap, inv)
                use_fed = tab_fed is not None
                if use_fed and check is not None:
                    info["check_epochs"] += 1
                    ok = tab_unw is not None and tab_unw["seR"] + tab_unw["spR"] > 1
                    if ok and check == "se":
                        ok = tab_fed["seR"] + tab_fed["spR"] > 1
                    elif ok:
                        r1 = tab_fed["pi"] / tab_unw["pi"]
                        r0 = (1 - tab_fed["pi"]) / (1 - tab_unw["pi"])
                        ok = (1 / check <= r1 <= check) and (1 / check <= r0 <= check)
                    if not ok:
                        use_fed = False
                        info["check_fail"] += 1
                tab = tab_fed if use_fed else tab_unw
            else:
                tab = tab_unw

        # --- scoring
        if method == "unweighted":
            val, w, binary = xv, np.ones_like(xv), None
            prior_w = np.zeros(ni)
            prior_v = np.zeros(ni)
        elif method == "noise":
            val, w = xv, omega[wk]
            prior_w = np.zeros(ni)
            prior_v = np.zeros(ni)
        else:
            val, w, binary = conf_vote_weights(tab, wk, xv, omega,
                                               allbin_item[loc] if graded == "batch" else None)
            if tab is None:
                prior_w = np.zeros(ni)
                prior_v = np.zeros(ni)
            else:
                pw = prior_scale * abs(math.log(tab["pi1"] / (1 - tab["pi1"]))) / tab["s"]
                prior_w = np.where(allbin_item, pw, 0.0)
                prior_v = np.full(ni, 1.0 if tab["pi1"] > 0.5 else 0.0)
        sw = group_sum(loc, w, ni)
        swx = group_sum(loc, w * val, ni)
        den = sw + prior_w
        a_mean = np.where(den > 0, (swx + prior_w * prior_v) / np.where(den > 0, den, 1), S0)
        beta = (1 - ALPHA) * np.minimum(1.0, sw / m)
        S[uit] = (1 - beta) * S0 + beta * a_mean

        # --- this epoch's unit sums
        d = xv - o_mean
        u = unit.astype(float)
        # confusion sums: in graded mode 'batch' only from units with only 0/1 votes
        uc = u * allbin_item[loc] if graded == "batch" else u
        pe = dict(n=group_sum(wk, u, W), q=group_sum(wk, u * d * d, W),
                  h=group_sum(wk, u / np.maximum(mv - 1, 1), W))
        if method == "conf":
            pe.update(c=group_sum(wk, uc, W), p=group_sum(wk, uc * o_mean, W),
                      a=group_sum(wk, uc * o_mean * xv, W),
                      b=group_sum(wk, uc * (1 - o_mean) * (1 - xv), W))
            if ref in ("mom", "hyb"):
                u3 = (mv >= 3).astype(float) * (uc > 0)
                so = Ssum[loc] - xv  # others' sum
                so2 = group_sum(loc, xv * xv, ni)[loc] - xv * xv
                r3 = np.where(mv >= 3, (so * so - so2) / np.maximum((mv - 1) * (mv - 2), 1), 0.0)
                pe.update(t3=group_sum(wk, u3 * r3 * xv, W), c3=group_sum(wk, u3, W))
            if ref in ("fed", "hyb"):
                if use_fed:
                    o_f = fed_reference(tab, loc, ni, wk, xv, val, w, allbin_item, fed_mode,
                                        ref_noinv, ref_noprior, o_mean, unit)
                else:
                    o_f = o_mean
                pe.update(cf=pe["c"], pf=group_sum(wk, uc * o_f, W),
                          af=group_sum(wk, uc * o_f * xv, W),
                          bf=group_sum(wk, uc * (1 - o_f) * (1 - xv), W))
        per_epoch[k] = pe
    if return_info:
        return S, info
    return S


def fed_reference(tab, loc, ni, wk, xv, val, w, allbin_item, mode, noinv, noprior, o_mean, unit):
    """Others' reference per vote under the table `tab` (never None here)."""
    if mode == "wmean":
        pw = 0.0 if noprior else abs(math.log(tab["pi1"] / (1 - tab["pi1"]))) / tab["s"]
        pv = 1.0 if tab["pi1"] > 0.5 else 0.0
        prior_w = np.where(allbin_item, pw, 0.0)
        if noinv:
            w = np.where(val != xv, 0.0, w)  # inverted sides count for nothing
        sw = group_sum(loc, w, ni)
        swx = group_sum(loc, w * val, ni)
        num = swx[loc] - w * val + (prior_w * pv)[loc]
        den = sw[loc] - w + prior_w[loc]
        return np.where(unit & (den > 0), num / np.where(den > 0, den, 1), o_mean)
    lp = tab["wp"][wk] * tab["s"]
    lm = tab["wm"][wk] * tab["s"]
    if noinv:
        lp, lm = np.maximum(lp, 0), np.maximum(lm, 0)
    e = xv * lp - (1 - xv) * lm
    L0 = 0.0 if noprior else math.log(tab["pi1"] / (1 - tab["pi1"]))
    L0 = np.where(allbin_item, L0, 0.0)
    Et = group_sum(loc, e, ni)
    z = L0[loc] + Et[loc] - e
    o = 1.0 / (1.0 + np.exp(-z))
    return np.where(unit, o, o_mean)


# ----------------------------------------------------------------- helpers

def accuracy(S, truth, tie=">="):
    ok = ~np.isnan(S) & ~np.isnan(truth)
    pred = (S[ok] >= 0.5) if tie == ">=" else (S[ok] > 0.5)
    return float(np.mean(pred.astype(float) == truth[ok]))


def mae(S, truth):
    ok = ~np.isnan(S) & ~np.isnan(truth)
    return float(np.mean(np.abs(S[ok] - truth[ok])))


def layout_times(n_items, seed, hours=168):
    rng = np.random.default_rng(seed)
    return rng.uniform(0.0, hours * 3600.0, size=n_items)


VARIANTS = {
    "unweighted": dict(method="unweighted"),
    "noise": dict(method="noise"),
    # others'-mean reference
    "mean": dict(method="conf", ref="mean", inv=False),
    "mean+inv": dict(method="conf", ref="mean", inv=True),
    "mean+inv/unseen-b": dict(method="conf", ref="mean", inv=True, unseen="b"),
    "mean+inv/cap3": dict(method="conf", ref="mean", inv=True, cap=3.0),
    "mean+inv/cap10": dict(method="conf", ref="mean", inv=True, cap=10.0),
    "mean+inv/noprior": dict(method="conf", ref="mean", inv=True, prior_scale=0.0),
    "mean+inv/graded-per-vote": dict(method="conf", ref="mean", inv=True, graded="vote"),
    # fed (posterior) reference and its guards
    "fed": dict(method="conf", ref="fed", inv=True),
    "fed/wmean": dict(method="conf", ref="fed", inv=True, fed_mode="wmean"),
    "fed/noinv-ref": dict(method="conf", ref="fed", inv=True, ref_noinv=True),
    "fed/noprior-ref": dict(method="conf", ref="fed", inv=True, ref_noprior=True),
    "fed/check2": dict(method="conf", ref="fed", inv=True, check=2.0),
    "fed/noinv-ref+check2": dict(method="conf", ref="fed", inv=True, ref_noinv=True, check=2.0),
    # others'-mean reference de-attenuated by agreement moments ("mom")
    "mom+inv/noguard": dict(method="conf", ref="mom", inv=True),
    "mom/z1": dict(method="conf", ref="mom", inv=False, zmin=1.0),
    "mom+inv/z1": dict(method="conf", ref="mom", inv=True, zmin=1.0),
    "mom+inv/z1/unseen-b": dict(method="conf", ref="mom", inv=True, zmin=1.0, unseen="b"),
    "mom+inv/z1/cap3": dict(method="conf", ref="mom", inv=True, zmin=1.0, cap=3.0),
    "mom+inv/z1/cap10": dict(method="conf", ref="mom", inv=True, zmin=1.0, cap=10.0),
    "mom+inv/z1.6": dict(method="conf", ref="mom", inv=True, zmin=1.6),
    # hybrid: the moment table where identified, else the fed table (checked), else mean
    "hyb/z1": dict(method="conf", ref="hyb", inv=True, zmin=1.0, check=2.0),
    "hyb/z1/nocheck": dict(method="conf", ref="hyb", inv=True, zmin=1.0),
    "hyb/z1/wmean": dict(method="conf", ref="hyb", inv=True, zmin=1.0, check=2.0, fed_mode="wmean"),
    "hyb/z1/wmean/unseen-b": dict(method="conf", ref="hyb", inv=True, zmin=1.0, check=2.0,
                                  fed_mode="wmean", unseen="b"),
    "hyb/z1/wmean/cap3": dict(method="conf", ref="hyb", inv=True, zmin=1.0, check=2.0,
                              fed_mode="wmean", cap=3.0),
    "hyb/z1/wmean/cap10": dict(method="conf", ref="hyb", inv=True, zmin=1.0, check=2.0,
                               fed_mode="wmean", cap=10.0),
    "fed/checkse": dict(method="conf", ref="fed", inv=True, check="se"),
    "fed/wmean/checkse": dict(method="conf", ref="fed", inv=True, check="se", fed_mode="wmean"),
    "hyb/z1/checkse": dict(method="conf", ref="hyb", inv=True, zmin=1.0, check="se"),
    "hyb/z1/wmean/checkse": dict(method="conf", ref="hyb", inv=True, zmin=1.0, check="se",
                                 fed_mode="wmean"),
    "oracle-ref": dict(method="conf", ref="truth", inv=True),
    "hyb/z1.6/wmean": dict(method="conf", ref="hyb", inv=True, zmin=1.6, check=2.0, fed_mode="wmean"),
}
