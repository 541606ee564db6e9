#!/usr/bin/env python3
"""An independent reading of contract §15 (docs/contract.md, "Which way a
reviewer errs"): the sums a unit adds, the table they give and a batch
scored with it, written from the contract's formulas in their order.

    tests/reputation/confusion_reference.py

prints the worked checks' numbers (the contract quotes them, and
src/engine/reputation/confusion/tests.rs and pairs/tests.rs assert them),
both for the rates fitted to the pair counts and for what the same sums
give without them (the moments or the mean). Python floats are IEEE
binary64 and round() rounds ties to even, as fix() requires; every f64
step is written in the contract's order (no fused multiply-add).
"""
import math

SCALE = float(1 << 40)
N0C, EPS, MAXW, Z = 5.0, 0.02, 10.0, 1.0
N0P, ROUNDS, MAX_PAIR_UNIT = 10.0, 100, 64


def fix(x):
    return int(round(x * SCALE))


def clamp(x, lo, hi):
    return min(hi, max(lo, x))


def unit_sums(values):
    """{voter: (c, p, a, b, c3, t3)} for a unit {voter: value}; {} unless it
    is a unit of 0/1 values."""
    vals = sorted(values.items())
    m = len(vals)
    if m < 2 or any(v not in (0.0, 1.0) for _, v in vals):
        return {}
    S = 0.0
    for _, v in vals:
        S += v
    out = {}
    for u, v in vals:
        k = S - v
        o = clamp(k / (m - 1), 0.0, 1.0)
        c3, t3 = 0, 0
        if m >= 3:
            c3, t3 = 1, fix(v * ((k * (k - 1.0)) / ((m - 1) * (m - 2))))
        out[u] = (1, fix(o), fix(o * v), fix((1.0 - o) * (1.0 - v)), c3, t3)
    return out


def unit_pairs(values):
    """{(a, b): [n00, n01, n10, n11]} for a unit {voter: value}: every pair
    of its reviewers once, a before b in voter_id byte order, counts[2·v_a
    + v_b]; {} unless the unit has 2..=64 values, all 0 or 1."""
    vals = sorted(values.items(), key=lambda kv: kv[0].encode())
    m = len(vals)
    if not (2 <= m <= MAX_PAIR_UNIT) or any(v not in (0.0, 1.0) for _, v in vals):
        return {}
    out = {}
    for i, (a, va) in enumerate(vals):
        for b, vb in vals[i + 1:]:
            counts = out.setdefault((a, b), [0, 0, 0, 0])
            counts[2 * int(va) + int(vb)] += 1
    return out


def add_pairs(into, unit):
    for key, counts in unit.items():
        n = into.setdefault(key, [0, 0, 0, 0])
        for i in range(4):
            n[i] += counts[i]


def pair_fit(voters, pairs, anchor, rounds=ROUNDS, n0p=None):
    """Contract §15 "The reviewers' rates from pair counts": (π, rubric se,
    rubric sp, {voter: (se_u, sp_u)}), or None without a pair observation.
    voters: the reviewers with C_u ≥ 1 in byte order; pairs: {(a, b): counts}."""
    n0p = N0P if n0p is None else n0p
    index = {u: i for i, u in enumerate(voters)}
    obs = [(index[a], index[b], pairs[(a, b)])
           for (a, b) in sorted(pairs, key=lambda k: (k[0].encode(), k[1].encode()))
           if a in index and b in index]
    total = 0
    for _, _, n in obs:
        total += n[0] + n[1] + n[2] + n[3]
    if total == 0:
        return None
    if anchor is not None:
        x, y, pi = anchor
        start = (x, 1.0 - y)
    else:
        start, pi = (0.8, 0.8), 0.5
    rates = [start] * len(voters)
    se_r, sp_r = 0.8, 0.8
    for _ in range(rounds):
        n1 = [0.0] * len(voters)
        U = [0.0] * len(voters)
        n0 = [0.0] * len(voters)
        V = [0.0] * len(voters)
        g1_sum = 0.0
        for a, b, counts in obs:
            (se_a, sp_a), (se_b, sp_b) = rates[a], rates[b]
            for cell in range(4):
                n = counts[cell]
                if n == 0:
                    continue
                va, vb = cell >> 1, cell & 1
                l1 = (se_a if va == 1 else 1.0 - se_a) * (se_b if vb == 1 else 1.0 - se_b)
                l0 = (1.0 - sp_a if va == 1 else sp_a) * (1.0 - sp_b if vb == 1 else sp_b)
                g = pi * l1 / (pi * l1 + (1.0 - pi) * l0)
                g1 = float(n) * g
                g0 = float(n) - g1
                for u, v in ((a, va), (b, vb)):
                    n1[u] += g1
                    n0[u] += g0
                    if v == 1:
                        U[u] += g1
                    else:
                        V[u] += g0
                g1_sum += g1
        pi = g1_sum / float(total)
        s_n1 = s_U = s_n0 = s_V = 0.0
        for u in range(len(voters)):
            s_n1 += n1[u]
            s_U += U[u]
            s_n0 += n0[u]
            s_V += V[u]
        if not (s_n1 > 0.0 and s_n0 > 0.0):
            break
        se_r = s_U / s_n1
        sp_r = s_V / s_n0
        new = []
        for u in range(len(voters)):
            if anchor is not None:
                t_se, t_sp = anchor[0], 1.0 - anchor[1]
            else:
                own = ((U[u] + n0p * se_r) / (n1[u] + n0p) + (V[u] + n0p * sp_r) / (n0[u] + n0p)) / 2.0
                t_se = t_sp = own
            new.append((clamp((U[u] + n0p * t_se) / (n1[u] + n0p), EPS, 1.0 - EPS),
                        clamp((V[u] + n0p * t_sp) / (n0[u] + n0p), EPS, 1.0 - EPS)))
        rates = new
    return pi, clamp(se_r, EPS, 1.0 - EPS), clamp(sp_r, EPS, 1.0 - EPS), dict(zip(voters, rates))


def add_sums(into, unit):
    for u, t in unit.items():
        s = into.setdefault(u, [0] * 6)
        for i in range(6):
            s[i] += t[i]


def moment_rates(C, P, A, C3, T3):
    if C3 == 0:
        return None
    M1 = (P / SCALE) / C
    M2 = (A / SCALE) / C
    M3 = (T3 / SCALE) / C3
    V = M2 - M1 * M1
    if not (V > 0.0 and V * math.sqrt(C) >= Z):
        return None
    e1 = (M3 - M1 * M2) / V
    e2 = (M1 * M3 - M2 * M2) / V
    D = e1 * e1 - 4.0 * e2
    if not D > 0.0:
        return None
    r = math.sqrt(D)
    x, y = (e1 + r) / 2.0, (e1 - r) / 2.0
    if not (y >= -0.05 and x <= 1.05):
        return None
    x, y = clamp(x, EPS, 1.0 - EPS), clamp(y, EPS, 1.0 - EPS)
    if not x > y:
        return None
    pi = (M1 - y) / (x - y)
    if not (0.0 < pi < 1.0):
        return None
    return x, y, pi


def table(sums, pairs=None):
    """The rubric's table, or None when empty; pairs: {(a, b): counts} (None
    or {}: no pair observation)."""
    voters = sorted((u for u, s in sums.items() if s[0] > 0), key=lambda u: u.encode())
    C = sum(sums[u][0] for u in voters)
    P = sum(sums[u][1] for u in voters)
    A = sum(sums[u][2] for u in voters)
    B = sum(sums[u][3] for u in voters)
    C3 = sum(sums[u][4] for u in voters)
    T3 = sum(sums[u][5] for u in voters)
    F = (C << 40) - P
    if C == 0 or P == 0 or F == 0:
        return None
    mom = moment_rates(C, P, A, C3, T3)
    fit = pair_fit(voters, pairs, mom) if pairs else None
    rows = {}
    if fit is not None:
        pi, se_r, sp_r, rates = fit
        if not (0.0 < pi < 1.0):
            return None
        for u in voters:
            rows[u] = (sums[u][0], rates[u][0], rates[u][1])
        prior_rate = (C * pi + N0C / 2.0) / (C + N0C)
        rates_from = "pairs"
    elif mom is not None:
        rates_from = "moments"
        x, y, pi = mom
        se_r, sp_r = x, 1.0 - y
        d = x - y
        for u in voters:
            c, p, a, b = sums[u][0], sums[u][1] / SCALE, sums[u][2] / SCALE, sums[u][3] / SCALE
            n1 = clamp((p - c * y) / d, 0.0, float(c))
            n0 = c - n1
            U = clamp(((a - n0 * y) * (1.0 - y) + y * (b - n1 * (1.0 - x))) / d, 0.0, n1)
            W = clamp((x * (b - n1 * (1.0 - x)) + (1.0 - x) * (a - n0 * y)) / d, 0.0, n0)
            se = x if n1 + N0C == 0.0 else (U + N0C * x) / (n1 + N0C)
            sp = 1.0 - y if n0 + N0C == 0.0 else (W + N0C * (1.0 - y)) / (n0 + N0C)
            rows[u] = (c, clamp(se, EPS, 1 - EPS), clamp(sp, EPS, 1 - EPS))
        prior_rate = (C * pi + N0C / 2.0) / (C + N0C)
    else:
        rates_from = "mean"
        pi = P / float(C << 40)
        se_r = (A / SCALE) / (P / SCALE)
        sp_r = (B / SCALE) / (F / SCALE)
        for u in voters:
            c, p, a, b = sums[u][0], sums[u][1] / SCALE, sums[u][2] / SCALE, sums[u][3] / SCALE
            f = ((c << 40) - sums[u][1]) / SCALE
            se = se_r if p + N0C == 0.0 else (a + N0C * se_r) / (p + N0C)
            sp = sp_r if f + N0C == 0.0 else (b + N0C * sp_r) / (f + N0C)
            rows[u] = (c, clamp(se, EPS, 1 - EPS), clamp(sp, EPS, 1 - EPS))
        prior_rate = (P / SCALE + N0C / 2.0) / (C + N0C)
    lam = {u: (math.log(se / (1.0 - sp)), math.log(sp / (1.0 - se))) for u, (c, se, sp) in rows.items()}
    better = sum(c for u, (c, se, sp) in rows.items() if se + sp > 1.0)
    if 2 * better <= C:
        return None
    s = 0.0
    for u in voters:
        lp, lm = lam[u]
        s += rows[u][0] * (pi * max(lp, 0.0) + (1.0 - pi) * max(lm, 0.0))
    s = s / C
    if not s > 0.0:
        return None
    unseen = (clamp(se_r, EPS, 1 - EPS), clamp(sp_r, EPS, 1 - EPS))
    lu = (math.log(unseen[0] / (1.0 - unseen[1])), math.log(unseen[1] / (1.0 - unseen[0])))
    w = lambda l: clamp(l / s, -MAXW, MAXW)
    return dict(
        rates_from=rates_from, pi=pi, se=se_r, sp=sp_r, s=s,
        prior=(1.0 if prior_rate > 0.5 else 0.0, min(abs(math.log(prior_rate / (1.0 - prior_rate))) / s, MAXW)),
        voters={u: dict(se=rows[u][1], sp=rows[u][2], pass_weight=w(lam[u][0]), flag_weight=w(lam[u][1])) for u in voters},
        unseen=dict(se=unseen[0], sp=unseen[1], pass_weight=w(lu[0]), flag_weight=w(lu[1])),
    )


def score(T, votes, S=0.5, alpha=math.exp(-36.0)):
    """A batch of 0/1 votes [(voter, value, r)] of a new series: m, σ², step, score."""
    counted = []
    R = 0.0
    for u, x, r in votes:
        side = T["voters"].get(u, T["unseen"])
        w = side["pass_weight"] if x == 1.0 else side["flag_weight"]
        y, g = (x, w) if w >= 0.0 else (1.0 - x, -w)
        counted.append((y, r * g))
        R += r
    Rp = Y = 0.0
    for y, g in counted:
        Rp += g
        Y += g * y
    mv = Y / Rp
    var = 0.0
    for y, g in counted:
        var += g * (y - mv) * (y - mv)
    var = var / Rp
    y0, w0 = T["prior"]
    m = (Y + w0 * y0) / (Rp + w0) if w0 > 0.0 else mv
    c = min(1.0, Rp / R)
    t = 1.0 - alpha
    beta, kappa = t * c, alpha + t * (1.0 - c)
    return dict(mean=m, variance=var, step=beta, score=kappa * S + beta * m, weights=[g for _, g in counted])


HOUR_ZERO = [(1, 1, 1, 1), (0, 0, 0, 1), (0, 0, 0, 1), (0, 0, 0, 0), (0, 0, 1, 1)]
BATCHES = [("a pass", [("a", 1.0, 1.0)]), ("l pass", [("l", 1.0, 1.0)]),
           ("n pass", [("n", 1.0, 1.0)]), ("a flag, l pass", [("a", 0.0, 1.0), ("l", 1.0, 1.0)]),
           ("c flag, l pass r 2", [("c", 0.0, 1.0), ("l", 1.0, 2.0)])]


def show(T, label):
    print("%s: rates from %s, pi %.6f, se %.6f, sp %.6f, s %.6f, prior %s" % (
        label, T["rates_from"], T["pi"], T["se"], T["sp"], T["s"], tuple(round(v, 6) for v in T["prior"])))
    for u, r in sorted(T["voters"].items()):
        print("  %s se %.6f sp %.6f pass %.6f flag %.6f" % (u, r["se"], r["sp"], r["pass_weight"], r["flag_weight"]))
    print("  unseen", {k: round(v, 6) for k, v in T["unseen"].items()})


def show_batches(T):
    for name, votes in BATCHES:
        print("  %s:" % name, {k: (round(v, 6) if isinstance(v, float) else [round(x, 6) for x in v])
                               for k, v in score(T, votes).items()})


def main_hand():
    """Check 7: one round, n₀ᵖ = 0, two reviewers, three (0, 0) and one (1, 1)."""
    pi, se, sp, rates = pair_fit(["a", "b"], {("a", "b"): [3, 0, 0, 1]}, None, rounds=1, n0p=0.0)
    print("check 7 (a pair fit by hand): pi %r (19/68 %r), se %r (16/19 %r), sp %r (48/49 %r)" % (
        pi, 19 / 68, se, 16 / 19, sp, 48 / 49))
    print("  rates", rates)
    assert abs(pi - 19 / 68) <= 1e-15 and abs(se - 16 / 19) <= 1e-15 and abs(sp - 48 / 49) <= 1e-15


def main():
    sums, pairs = {}, {}
    for unit in HOUR_ZERO:
        values = dict(zip("abcl", map(float, unit)))
        add_sums(sums, unit_sums(values))
        add_pairs(pairs, unit_pairs(values))
    print("sums (c, p, a, b, c3, t3):")
    for u in sorted(sums):
        c, p, a, b, c3, t3 = sums[u]
        print("  %s %d %.6f %.6f %.6f %d %.6f" % (u, c, p / SCALE, a / SCALE, b / SCALE, c3, t3 / SCALE))
    print("pair counts (a, b): n00 n01 n10 n11")
    for key in sorted(pairs):
        print("  %s %s:" % key, *pairs[key])
    T = table(sums)
    show(T, "without pair counts (checks 2-4)")
    show_batches(T)
    T = table(sums, pairs)
    show(T, "with pair counts (checks 8, 9)")
    print("  pi' %.6f" % ((20 * T["pi"] + N0C / 2.0) / (20 + N0C)), "full", {
        "pi": T["pi"], "se": T["se"], "sp": T["sp"], "s": T["s"], "w0": T["prior"][1]})
    for u, r in sorted(T["voters"].items()):
        print("   ", u, r)
    show_batches(T)


FORMAT_ITEMS = [((1, 1, 1), 6), ((1, 1, 0), 1), ((1, 0, 1), 1), ((0, 1, 1), 1),
                ((1, 0, 0), 2), ((0, 1, 0), 2), ((0, 0, 1), 2), ((0, 0, 0), 25)]


def main_moments():
    sums, pairs = {}, {}
    for pattern, n in FORMAT_ITEMS:
        for _ in range(n):
            values = dict(zip("abc", map(float, pattern)))
            add_sums(sums, unit_sums(values))
            add_pairs(pairs, unit_pairs(values))
    for label, T in (("check 6 (without pair counts)", table(sums)),
                     ("check 10 (with pair counts)", table(sums, pairs))):
        show(T, label)
        C = 120
        print("  pi' %.6f" % ((C * T["pi"] + N0C / 2.0) / (C + N0C)))
        print("  a pass:", {k: (round(v, 6) if isinstance(v, float) else [round(x, 6) for x in v])
                            for k, v in score(T, [("a", 1.0, 1.0)]).items()})
    print("  pair counts:", {"%s %s" % k: v for k, v in sorted(pairs.items())})


if __name__ == "__main__":
    main()
    main_hand()
    main_moments()
