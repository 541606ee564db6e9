#!/usr/bin/env python3
"""Each mode's cost against the first mode's, from turn-about runs.

Reads lines "LABEL COST" on stdin in the order the runs ran, and fits
COST = a + b*run + effect[LABEL] by least squares: the run number soaks up
a drift that runs in one direction across the benchmark (on this test
machine, for example, a broker that holds every earlier run's topics in
memory makes each run a little dearer than the one before: PERFORMANCE.md,
"Learned reputation", "Turn about in alternating order"). Prints, per
label, its effect as a ratio to the first label's cost at the middle run,
with one standard error. Use it with runs in alternating order (ABC, CBA,
ABC, ...): then a linear drift falls on every mode alike even before the
fit, and the fit only narrows the error.

Pure Python on purpose (no numpy in the benchmark's requirements): the
system is 2 + labels unknowns, solved by Gauss-Jordan elimination.
"""

import math
import sys


def solve(a, b):
    """x with a·x = b (a square, well conditioned: a few unknowns)."""
    n = len(a)
    m = [row[:] + [v] for row, v in zip(a, b)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit(runs):
    """runs: [(label, cost)] in run order -> (labels, base, drift, {label:
    (effect, se)}); all but labels None when the runs are too few."""
    labels = []
    for label, _ in runs:
        if label not in labels:
            labels.append(label)
    # Unknowns: a, b, then one effect per label after the first.
    rows = [[1.0, float(t)] + [float(label == l) for l in labels[1:]] for t, (label, _) in enumerate(runs)]
    y = [cost for _, cost in runs]
    k = len(rows[0])
    if len(rows) <= k:
        return labels, None, None, None
    xtx = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    xty = [sum(r[i] * v for r, v in zip(rows, y)) for i in range(k)]
    beta = solve(xtx, xty)
    resid = [v - sum(r[j] * beta[j] for j in range(k)) for r, v in zip(rows, y)]
    s2 = sum(e * e for e in resid) / (len(rows) - k)
    # The effects' variances: the diagonal of s2 * (X'X)^-1.
    var = [s2 * solve(xtx, [float(i == j) for j in range(k)])[i] for i in range(k)]
    base = beta[0] + beta[1] * (len(runs) - 1) / 2
    effects = {labels[0]: (0.0, 0.0)}
    for i, label in enumerate(labels[1:], start=2):
        effects[label] = (beta[i], math.sqrt(max(var[i], 0.0)))
    return labels, base, beta[1], effects


def main():
    runs = []
    for line in sys.stdin:
        parts = line.split()
        if len(parts) >= 2:
            runs.append((parts[0], float(parts[1])))
    labels, base, drift, effects = fit(runs)
    if base is None:
        print(f"no fit: {len(runs)} runs are too few for a drift and {len(labels)} modes (ROUNDS >= 2)")
        return
    print(f"fit over {len(runs)} runs in run order: {labels[0]} {base:.2f} at the middle run, "
          f"drift {drift:+.3f} per run ({drift / base * 100:+.1f} %)")
    for label in labels[1:]:
        e, se = effects[label]
        print(f"  {label:12s} {1 + e / base:.3f} x {labels[0]} (one standard error {se / base:.3f})")


if __name__ == "__main__":
    main()
