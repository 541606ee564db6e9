#!/usr/bin/env python3
"""Judge the real binary: the `confusion` reputation model as implemented,
replayed over the same vote layouts as the simulation (real.py, planted.py).

    python judge.py [--bin JURYSTREAM] [--data DATA_DIR] [--seeds 1,2,3]
                    [--sets product,bluebirds,emotion,planted] [--pops a,b]
                    [--cache CK.json] [--seed-cache planted.json real.json ...]
                    [--json OUT.json] [--keep DIR]

The binary (default $JURYSTREAM_BIN, else the release build under
$CARGO_TARGET_DIR or target/) is run as
`replay --config C --input VOTES` with three configurations: mode off
(unweighted), learned with model noise (section 14) and learned with model
confusion (section 15), epoch_seconds 3600, everything else at its default
(window 60 s, grace 5 s, lambda 0.01/s, n0c 5, eps 0.02, M 10). Each item's
score is the `score` of its last `score_updated` event; binary sets: pass
iff score >= 0.5, % accuracy; emotion: MAE against the truth.

Layout (as the simulation's): every item is one batch at a time drawn by
model.layout_times(n_items, seed) (real sets) or planted.generate (planted
sets) over 168 h from 2024-01-01T00:00:00Z (an hour boundary, so epochs
coincide with the simulation's floor(t / 3600)); an item's votes are 1 ms
apart inside one 60 s window; lines sorted by timestamp. One rubric per
data set (voter_prompt_id = the set's name).

The simulation's counterpart of the binary's `confusion` is model.run with
ref "mom", inversion, identification guard z = 1, unseen reviewers at the
rubric's rates (option b) and side weights capped at 10 (SIM_CONF below);
judge.py runs it on the same layout and compares item by item.

crowd-kit (MV, DS, OneCoinDS, GLAD, as real.py / planted.py fit them) is
cached per data set and seed in --cache (GLAD takes ~2 min on product and
~15 min over all planted populations). --seed-cache takes result files of
planted.py --json / real.py --json and copies their crowd-kit numbers when
their `unweighted` numbers equal this run's (same votes).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402
import planted  # noqa: E402
import real  # noqa: E402

BASE = 1704067200  # 2024-01-01T00:00:00Z, a multiple of 3600
SPREAD_NS = 1_000_000  # 1 ms between an item's votes
WINDOW_NS = 60 * 10**9
SIM_CONF = dict(method="conf", ref="mom", inv=True, zmin=1.0, unseen="b", cap=10.0)
CONFIGS = {
    "off": '[reputation]\nmode = "off"\n',
    "noise": '[reputation]\nmode = "learned"\nepoch_seconds = 3600\nmodel = "noise"\n',
    "confusion": '[reputation]\nmode = "learned"\nepoch_seconds = 3600\nmodel = "confusion"\n',
}
CK = ["MV", "DS", "OneCoinDS", "GLAD"]


def rfc3339(ns):
    sec, frac = divmod(int(ns), 10**9)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{frac:09d}Z"


def write_votes(D, times, rubric, path):
    """The vote log of data set D with item times `times` (seconds from BASE)."""
    item, worker, x = D["item"], D["worker"], D["x"]
    tasks = D.get("tasks")
    workers = D.get("workers")
    order = np.argsort(item, kind="stable")
    bounds = np.searchsorted(item[order], np.arange(D["n_items"] + 1))
    rows = []
    for i in range(D["n_items"]):
        idx = order[bounds[i]:bounds[i + 1]]
        if len(idx) == 0:
            continue
        t_ns = int(np.floor(times[i] * 1e9))
        if t_ns // (3600 * 10**9) != int(np.floor(times[i] / 3600.0)):
            raise ValueError(f"item {i}: epoch changes in the ns rounding")
        start = t_ns
        last = start + (len(idx) - 1) * SPREAD_NS
        if last // WINDOW_NS != start // WINDOW_NS:  # keep the votes in one window
            start = (start // WINDOW_NS + 1) * WINDOW_NS - 1 - (len(idx) - 1) * SPREAD_NS
        iid = str(tasks[i]) if tasks is not None else f"item{i}"
        for j, v in enumerate(idx):
            ts = start + j * SPREAD_NS
            wid = str(workers[worker[v]]) if workers is not None else f"rev{worker[v]:02d}"
            val = float(x[v])
            rows.append((ts, len(rows), dict(
                inference_id=iid, voter_id=wid, voter_prompt_id=rubric,
                vote=int(val) if val in (0.0, 1.0) else val,
                timestamp=rfc3339(BASE * 10**9 + ts), vote_id=f"{iid}/{wid}")))
    rows.sort(key=lambda r: (r[0], r[1]))
    with open(path, "w") as f:
        for _, _, obj in rows:
            f.write(json.dumps(obj, separators=(",", ":")) + "\n")
    return len(rows)


def run_binary(binary, cfg_path, votes_path):
    """{inference_id: score of its last score_updated event}, wall time, other events."""
    t0 = time.time()
    proc = subprocess.run([binary, "replay", "--config", cfg_path, "--input", votes_path],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    dt = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{binary} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    scores, n_updates, other = {}, 0, {}
    for line in proc.stdout.splitlines():
        ev = json.loads(line)
        if ev["type"] == "score_updated":
            scores[str(ev["inference_id"])] = ev["score"]
            n_updates += 1
        else:
            other[ev["type"]] = other.get(ev["type"], 0) + 1
    return scores, dt, n_updates, other


def item_ids(D):
    if D.get("tasks") is not None:
        return [str(t) for t in D["tasks"]]
    return [f"item{i}" for i in range(D["n_items"])]


def run_sim_prior_capped(D, times, prior_cap=10.0, **kw):
    """model.run with the prior pseudo-vote's weight capped at `prior_cap` as in the
    contract (w0 = min(|logit pi'| / s, M)); model.py caps only the side weights.
    Done by moving pi' to the log-odds cap * s (same side) in each table."""
    orig = model.conf_table_mom

    def capped(*a, **k):
        tab = orig(*a, **k)
        if tab is not None:
            lo = math.log(tab["pi1"] / (1 - tab["pi1"]))
            if abs(lo) / tab["s"] > prior_cap:
                tab["pi1"] = 1 / (1 + math.exp(-math.copysign(prior_cap * tab["s"], lo)))
        return tab

    model.conf_table_mom = capped
    try:
        return model.run(D["item"], D["worker"], D["x"], times, D["n_items"], D["n_workers"], **kw)
    finally:
        model.conf_table_mom = orig


def metric(S, truth, is_binary):
    return 100 * model.accuracy(S, truth) if is_binary else model.mae(S, truth)


def judge_layout(args, D, times, rubric, is_binary, tmp):
    """Binary (off, noise, confusion) and simulation on one layout."""
    votes = os.path.join(tmp, f"{rubric}.jsonl")
    write_votes(D, times, rubric, votes)
    ids = item_ids(D)
    out, detail = {}, {}
    for name, text in CONFIGS.items():
        cfg = os.path.join(tmp, f"{name}.toml")
        with open(cfg, "w") as f:
            f.write(text)
        sc, dt, nup, other = run_binary(args.bin, cfg, votes)
        if other.get("vote_rejected"):
            print(f"   note: {name}: {other['vote_rejected']} votes rejected", flush=True)
        S = np.array([sc.get(i, np.nan) for i in ids], dtype=float)
        out[name] = metric(S, D["truth"], is_binary)
        detail[name] = dict(S=S, time=dt, updates=nup)
    sims = {"off": dict(method="unweighted"), "noise": dict(method="noise"), "confusion": SIM_CONF}
    for name, kw in sims.items():
        S = model.run(D["item"], D["worker"], D["x"], times, D["n_items"], D["n_workers"], **kw)
        out["sim " + name] = metric(S, D["truth"], is_binary)
        Sb = detail[name]["S"]
        ok = ~np.isnan(S) & ~np.isnan(Sb)
        d = np.abs(S[ok] - Sb[ok])
        flips = int(np.sum((S[ok] >= 0.5) != (Sb[ok] >= 0.5))) if is_binary else 0
        detail[name].update(max_diff=float(d.max()) if len(d) else 0.0, flips=flips,
                            worst=ids[int(np.flatnonzero(ok)[np.argmax(d)])] if len(d) else None)
    # the simulation with the prior capped as the contract does (explains the differences)
    S = run_sim_prior_capped(D, times, **SIM_CONF)
    out["sim confusion w0cap"] = metric(S, D["truth"], is_binary)
    Sb = detail["confusion"]["S"]
    ok = ~np.isnan(S) & ~np.isnan(Sb)
    detail["confusion"]["max_diff_w0cap"] = float(np.abs(S[ok] - Sb[ok]).max()) if ok.any() else 0.0
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        os.replace(votes, os.path.join(args.keep, os.path.basename(votes)))
    return out, detail


def crowdkit(D, is_real):
    if is_real:
        r = real.crowdkit_scores(D)
        return {k: r["crowdkit " + k][0] for k in CK}
    r = planted.crowdkit_acc(D)
    return {k: r["ck " + k] for k in CK}


def seed_cache(cache, paths, unw):
    """Copy crowd-kit numbers from planted.py / real.py result files whose
    `unweighted` numbers equal this run's sim unweighted (same votes)."""
    for p in paths or []:
        with open(p) as f:
            res = json.load(f)
        for set_name, r in res.items():
            u = r.get("unweighted")
            if u is None:
                continue
            if isinstance(u, dict):  # planted.py: {seed: acc}; crowd-kit per seed
                for seed, acc in u.items():
                    key = f"{set_name}|{seed}"
                    if key in unw and abs(unw[key] - acc) < 1e-9 and all(
                            "ck " + k in r and seed in r["ck " + k] for k in CK):
                        cache.setdefault(key, {k: r["ck " + k][seed] for k in CK})
            else:  # real.py: [acc per layout seed]; crowd-kit does not depend on the layout
                key = f"{set_name}|*"
                if key in unw and abs(unw[key] - u[0]) < 1e-9 and all(
                        "crowdkit " + k in r for k in CK):
                    cache.setdefault(key, {k: r["crowdkit " + k][0] for k in CK})


def fmt_range(vals, is_binary):
    vals = [v for v in vals if v is not None and not np.isnan(v)]
    if not vals:
        return "-"
    f = (lambda v: f"{v:.1f}") if is_binary else (lambda v: f"{v:.4f}")
    lo, hi = min(vals), max(vals)
    return f(lo) if f(lo) == f(hi) else f"{f(lo)}-{f(hi)}"


def verdicts(name, r, seeds, is_binary):
    """Bars for confusion, per seed; a bar is met when it holds on every seed
    (and on the mean over seeds, given in parentheses when some seed fails)."""
    conf = [r["confusion"][s] for s in seeds]
    out = []

    def bar(label, diffs):
        ok_all = all(d >= -1e-9 for d in diffs)
        mean_ok = float(np.mean(diffs)) >= -1e-9
        word = "yes" if ok_all else ("mean only" if mean_ok else "no")
        out.append(f"{label}: {word} (worst margin {min(diffs):+.2f})" if is_binary else
                   f"{label}: {word} (worst margin {min(diffs):+.5f})")

    if is_binary:
        bar(">= off", [c - r["off"][s] for c, s in zip(conf, seeds)])
        if "GLAD" in r:
            bar(">= GLAD", [c - r["GLAD"][s] for c, s in zip(conf, seeds)])
            bar(">= DS - 2", [c - r["DS"][s] + 2 for c, s in zip(conf, seeds)])
        if name == "product":
            bar(">= 93.0 %", [c - 93.0 for c in conf])
        if name == "bluebirds":
            bar(">= 81 %", [c - 81.0 for c in conf])
    else:
        bar("MAE <= off", [r["off"][s] - c for c, s in zip(conf, seeds)])
        bar("MAE <= noise", [r["noise"][s] - c for c, s in zip(conf, seeds)])
    return out


def table(name, r, seeds, is_binary, timing):
    cols = ["off", "noise", "confusion"] + ([k for k in CK if k in r] if is_binary else [])
    unit = "% accuracy" if is_binary else "MAE"
    lines = [f"#### {name} ({unit}, min-max over seeds {','.join(map(str, seeds))})", "",
             "| " + " | ".join(["off (unweighted)", "noise", "confusion"] +
                               [f"ck {k}" for k in cols[3:]]) + " |",
             "|---" * len(cols) + "|",
             "| " + " | ".join(fmt_range([r[c][s] for s in seeds], is_binary) for c in cols) + " |",
             "", "Bars for confusion: " + "; ".join(verdicts(name, r, seeds, is_binary)) + ".", ""]
    sim = " / ".join(fmt_range([r["sim " + m][s] for s in seeds], is_binary)
                     for m in ("off", "noise", "confusion"))
    dif = []
    for m in ("off", "noise", "confusion"):
        d = [r["binary - sim " + m][s] for s in seeds]
        f = [r["flips " + m][s] for s in seeds]
        dif.append(f"{m} {max(d, key=abs):+.2f}" if is_binary else f"{m} {max(d, key=abs):+.5f}")
        if is_binary:
            dif[-1] += f" ({max(f)} items flipped)"
    lines.append(f"Simulation (off / noise / mom+inv z1 unseen-b cap10): {sim}; "
                 f"binary - simulation, largest over seeds: {', '.join(dif)}. "
                 f"With the prior capped at 10 as in the contract, the simulation's confusion "
                 f"scores are within {max(r['max |dS| confusion w0cap'][s] for s in seeds):.1e} "
                 f"of the binary's (accuracy difference "
                 f"{max((r['binary - sim confusion w0cap'][s] for s in seeds), key=abs):+.2f}). "
                 f"Binary replay time per layout: {timing}.")
    lines.append("")
    return "\n".join(lines)


def summary(results):
    """One markdown table over every data set of a --json result file."""
    def rng(d, b):
        vals = [d[s] for s in sorted(d)]
        return fmt_range(vals, b)

    def bar(diffs):
        if all(x >= -1e-9 for x in diffs):
            return "yes"
        return "mean" if np.mean(diffs) >= -1e-9 else "no"

    lines = ["| set | off | noise | confusion | ck MV | ck DS | ck OneCoinDS | ck GLAD | >= off | "
             ">= GLAD | >= DS - 2 | sim mom+inv | binary - sim per seed | same, sim prior capped |",
             "|---" * 14 + "|"]
    for name, r in results.items():
        b = name != "emotion"
        seeds = sorted(r["confusion"])
        c = [r["confusion"][s] for s in seeds]
        if b:
            ge_off = bar([c[i] - r["off"][s] for i, s in enumerate(seeds)])
            if "GLAD" in r:
                ge_glad = bar([c[i] - r["GLAD"][s] for i, s in enumerate(seeds)])
                ge_ds = bar([c[i] - r["DS"][s] + 2 for i, s in enumerate(seeds)])
                ck = [rng(r[k], b) for k in CK]
            else:
                ge_glad = ge_ds = "-"
                ck = ["-"] * 4
        else:  # MAE: lower is better
            ge_off = bar([r["off"][s] - c[i] for i, s in enumerate(seeds)])
            ge_glad = ge_ds = "-"
            ck = ["-"] * 4
        f = (lambda x: f"{x:+.2f}") if b else (lambda x: f"{x:+.1e}")
        dd = " / ".join(f(r["binary - sim confusion"][s]) for s in seeds)
        dc = " / ".join(f(r["binary - sim confusion w0cap"][s]) for s in seeds)
        lines.append(f"| {name} | {rng(r['off'], b)} | {rng(r['noise'], b)} | {rng(r['confusion'], b)} | "
                     + " | ".join(ck) + f" | {ge_off} | {ge_glad} | {ge_ds} | "
                     f"{rng(r['sim confusion'], b)} | {dd} | {dc} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.environ.get("JURYSTREAM_BIN") or os.path.join(
        os.environ.get("CARGO_TARGET_DIR") or os.path.join(os.path.dirname(__file__), "..", "..", "target"),
        "release", "jurystream"))
    ap.add_argument("--data", default="/tmp/proto/data")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--sets", default="product,bluebirds,emotion,planted")
    ap.add_argument("--pops", default=",".join(planted.POPS))
    ap.add_argument("--cache", default="judge_crowdkit.json",
                    help="crowd-kit results per data set and seed (read and extended)")
    ap.add_argument("--seed-cache", nargs="*", help="planted.py / real.py --json result files")
    ap.add_argument("--no-crowdkit", action="store_true", help="use cached crowd-kit numbers only")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--keep", help="keep the vote logs in this directory")
    ap.add_argument("--report", metavar="JSON", help="only print the summary table of a --json file")
    args = ap.parse_args()
    if args.report:
        with open(args.report) as f:
            print(summary(json.load(f)))
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    cache = {}
    if os.path.exists(args.cache):
        with open(args.cache) as f:
            cache = json.load(f)
    results, tables = {}, []
    t_start = time.time()
    jobs = []
    for name in args.sets.split(","):
        if name == "planted":
            jobs += [(p, False) for p in args.pops.split(",")]
        else:
            jobs.append((name, True))
    for name, is_real in jobs:
        t0 = time.time()
        is_binary = real.BINARY[name] if is_real else True
        r = {}
        times_bin = []
        D_real = real.LOADERS[name](args.data) if is_real else None
        for seed in seeds:
            if is_real:
                D = D_real
                times = model.layout_times(D["n_items"], seed)
            else:
                D = planted.generate(name, seed)
                times = D["times"]
            with tempfile.TemporaryDirectory(prefix="judge-") as tmp:
                out, detail = judge_layout(args, D, times, name if is_real else "planted", is_binary, tmp)
            for k, v in out.items():
                r.setdefault(k, {})[seed] = v
            for m in ("off", "noise", "confusion"):
                r.setdefault("binary - sim " + m, {})[seed] = out[m] - out["sim " + m]
                r.setdefault("flips " + m, {})[seed] = detail[m]["flips"]
                r.setdefault("max |dS| " + m, {})[seed] = detail[m]["max_diff"]
                r.setdefault("worst item " + m, {})[seed] = detail[m]["worst"]
            r.setdefault("max |dS| confusion w0cap", {})[seed] = detail["confusion"]["max_diff_w0cap"]
            r.setdefault("binary - sim confusion w0cap", {})[seed] = (
                out["confusion"] - out["sim confusion w0cap"])
            times_bin.append(sum(detail[m]["time"] for m in CONFIGS))
            if is_binary:
                key = f"{name}|*" if is_real else f"{name}|{seed}"
                seed_cache(cache, args.seed_cache, {key: out["sim off"]})
                if key not in cache and not args.no_crowdkit:
                    cache[key] = crowdkit(D, is_real)
                with open(args.cache, "w") as f:
                    json.dump(cache, f, indent=1)
                if key in cache:
                    for k in CK:
                        r.setdefault(k, {})[seed] = cache[key][k]
            line = ", ".join(f"{k} {v[seed]:.4g}" for k, v in r.items() if not k.startswith("worst"))
            print(f"   {name} seed {seed}: {line}", flush=True)
        timing = "/".join(f"{t:.0f}" for t in times_bin) + " s (off+noise+confusion)"
        tables.append(table(name, r, seeds, is_binary, timing))
        print(tables[-1], flush=True)
        print(f"   ({name}: {time.time() - t0:.0f} s)", flush=True)
        results[name] = {k: {str(s): v for s, v in d.items()} for k, d in r.items()}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    print("\n## All tables\n")
    print("\n".join(tables))
    print("## Summary (yes: every seed; mean: the mean over seeds only)\n")
    print(summary(results))
    print(f"(total {time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
