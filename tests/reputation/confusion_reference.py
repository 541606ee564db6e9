#!/usr/bin/env python3
"""An independent reading of contract §15 (docs/contract.md, "Which way a
reviewer errs"): the sums a unit adds, the table they give and a batch
scored with it, written from the contract's formulas in their order.

    tests/reputation/confusion_reference.py

prints the worked checks' numbers (the contract quotes them, and
src/engine/reputation/confusion/tests.rs asserts them). Python floats are
IEEE binary64 and round() rounds ties to even, as fix() requires.
"""
import math

SCALE = float(1 << 40)
N0C, EPS, MAXW, Z = 5.0, 0.02, 10.0, 1.0


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


def table(sums):
    voters = sorted(u for u, s in sums.items() if s[0] > 0)
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
    rows = {}
    if mom is not None:
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
        rates_from="moments" if mom else "mean", pi=pi, se=se_r, sp=sp_r, s=s,
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


def main():
    sums = {}
    for unit in HOUR_ZERO:
        add_sums(sums, unit_sums(dict(zip("abcl", map(float, unit)))))
    print("sums (c, p, a, b, c3, t3):")
    for u in sorted(sums):
        c, p, a, b, c3, t3 = sums[u]
        print("  %s %d %.6f %.6f %.6f %d %.6f" % (u, c, p / SCALE, a / SCALE, b / SCALE, c3, t3 / SCALE))
    T = table(sums)
    print("table: rates from %s, pi %.6f, se %.6f, sp %.6f, s %.6f, prior %s" % (
        T["rates_from"], T["pi"], T["se"], T["sp"], T["s"], tuple(round(v, 6) for v in T["prior"])))
    for u, r in sorted(T["voters"].items()):
        print("  %s se %.6f sp %.6f pass %.6f flag %.6f" % (u, r["se"], r["sp"], r["pass_weight"], r["flag_weight"]))
    print("  unseen", {k: round(v, 6) for k, v in T["unseen"].items()})
    for name, votes in [("a pass", [("a", 1.0, 1.0)]), ("l pass", [("l", 1.0, 1.0)]),
                        ("n pass", [("n", 1.0, 1.0)]), ("a flag, l pass", [("a", 0.0, 1.0), ("l", 1.0, 1.0)]),
                        ("c flag, l pass r 2", [("c", 0.0, 1.0), ("l", 1.0, 2.0)])]:
        print("  %s:" % name, {k: (round(v, 6) if isinstance(v, float) else [round(x, 6) for x in v]) for k, v in score(T, votes).items()})


FORMAT_ITEMS = [((1, 1, 1), 6), ((1, 1, 0), 1), ((1, 0, 1), 1), ((0, 1, 1), 1),
                ((1, 0, 0), 2), ((0, 1, 0), 2), ((0, 0, 1), 2), ((0, 0, 0), 25)]


def main_moments():
    sums = {}
    for pattern, n in FORMAT_ITEMS:
        for _ in range(n):
            add_sums(sums, unit_sums(dict(zip("abc", map(float, pattern)))))
    T = table(sums)
    print("check 6: rates from %s, pi %.6f, se %.6f, sp %.6f, s %.6f, prior %s" % (
        T["rates_from"], T["pi"], T["se"], T["sp"], T["s"], tuple(round(v, 6) for v in T["prior"])))
    for u, r in sorted(T["voters"].items()):
        print("  %s se %.6f sp %.6f pass %.6f flag %.6f" % (u, r["se"], r["sp"], r["pass_weight"], r["flag_weight"]))
    print("  a pass:", round(score(T, [("a", 1.0, 1.0)])["score"], 6))


if __name__ == "__main__":
    main()
    main_moments()
