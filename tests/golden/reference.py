#!/usr/bin/env python3
"""An independent reference of the replay contract (docs/contract.md §1–§5), used to
check the golden cases' expected outputs by a second implementation.

    python3 tests/golden/reference.py tests/golden/CASE [...]   # check cases
    python3 tests/golden/reference.py --all                      # every case
    python3 tests/golden/reference.py --print tests/golden/CASE  # show events

It reads CASE/config.toml and CASE/input.jsonl, computes the events the
contract asks for, straight from the formulas (Python floats, standard
library only, nothing shared with the Rust code), and compares them with
CASE/expected.jsonl, in order:

- `processed_at` must be a string and is otherwise ignored;
- numbers within 1e-9 (relative or absolute); booleans are not numbers;
- times compare as instants (both must be UTC);
- `vote_rejected.detail` must be a non-empty string naming the field the
  reference names (when there is one);
- vote ids the implementation derives (votes without `vote_id`) compare by
  count only.

Exit status 0 only when every case agrees.
"""
import json
import math
import os
import re
import sys
import tomllib

NS = 10**9

DEFAULTS = {
    "batching": {"window_seconds": 60, "grace_seconds": 5, "max_votes": 1000},
    "scoring": {
        "initial_score": 0.5,
        "initial_gap_seconds": 3600,
        "lambda": 0.01,
        "time_unit": "seconds",
        "aggregator": "mean",
        "temperature": 0.5,
    },
    "ambiguity": {"min_votes": 2, "variance_threshold": 0.05},
    "input": {"max_message_bytes": 1048576, "default_voter_prompt_id": None},
    "dedupe": {"retention_seconds": 2592000},
}
UNIT_SECONDS = {"seconds": 1, "minutes": 60, "hours": 3600, "days": 86400}
LABELS = {
    "pass": 1.0,
    "flag": 0.0,
    "fully": 1.0,
    "mostly": 0.9,
    "partial": 0.7,
    "minor": 0.3,
    "none": 0.0,
}
DERIVED = "derived:"


def load_config(path):
    with open(path, "rb") as f:
        user = tomllib.load(f)
    cfg = {k: dict(v) for k, v in DEFAULTS.items()}
    for section, values in user.items():
        if section == "rubrics":
            continue
        if isinstance(values, dict):
            cfg.setdefault(section, {}).update(values)
    cfg["rubrics"] = user.get("rubrics", {})
    return cfg


def to_ns(seconds):
    """Seconds (int or float from TOML) to whole nanoseconds."""
    if isinstance(seconds, int):
        return seconds * NS
    return round(seconds * NS)


# ---------------------------------------------------------------- times

_TIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]{1,9}))?([Zz]|[+-][0-9]{2}:[0-9]{2})?"
)


def days_from_civil(y, m, d):
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    mp = (m + 9) % 12
    doy = (153 * mp + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(z):
    z += 719468
    era = (z if z >= 0 else z - 146096) // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return (y + (m <= 2), m, d)


def month_days(y, m):
    if m == 2:
        return 29 if (y % 4 == 0 and y % 100 != 0) or y % 400 == 0 else 28
    return 30 if m in (4, 6, 9, 11) else 31


def parse_time(text):
    """contract §1 time -> integer ns since the epoch, or None."""
    if not isinstance(text, str):
        return None
    m = _TIME.fullmatch(text)
    if not m:
        return None
    y, mo, d, hh, mi, ss = (int(m.group(i)) for i in range(1, 7))
    if not (1 <= mo <= 12 and 1 <= d <= month_days(y, mo)):
        return None
    if hh > 23 or mi > 59 or ss > 59:
        return None
    frac = int((m.group(7) or "").ljust(9, "0"))
    off = 0
    tz = m.group(8)
    if tz and tz not in "Zz":
        oh, om = int(tz[1:3]), int(tz[4:6])
        if oh > 23 or om > 59:
            return None
        off = (oh * 3600 + om * 60) * (1 if tz[0] == "+" else -1)
    secs = days_from_civil(y, mo, d) * 86400 + hh * 3600 + mi * 60 + ss - off
    return secs * NS + frac


def fmt_time(ns):
    secs, frac = divmod(ns, NS)
    days, rem = divmod(secs, 86400)
    y, m, d = civil_from_days(days)
    return "%04d-%02d-%02dT%02d:%02d:%02d.%09dZ" % (
        y, m, d, rem // 3600, rem // 60 % 60, rem % 60, frac)


# ---------------------------------------------------------------- input


class Reject(Exception):
    def __init__(self, reason, field=None):
        super().__init__(reason)
        self.reason = reason
        self.field = field


def _no_constants(name):
    raise ValueError("not JSON: " + name)


def _depth(v):
    """Nesting depth of a decoded JSON value (an object alone is 1)."""
    best, stack = 0, [(v, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (list, dict)):
            best = max(best, d)
            for y in (x.values() if isinstance(x, dict) else x):
                stack.append((y, d + 1))
    return best


def _finite_floats(v):
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, float) and not math.isfinite(x):
            return False
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return True


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def id_value(obj, name):
    v = obj.get(name)
    if v is None:
        return None
    if isinstance(v, str):
        if not 1 <= len(v.encode("utf-8")) <= 256:
            raise Reject("invalid_field", name)
        return v
    if is_int(v) and -(2**63) <= v < 2**64:
        return str(v)
    raise Reject("invalid_field", name)


def time_value(obj, name):
    t = parse_time(obj[name])
    if t is None:
        raise Reject("invalid_timestamp", name)
    return t


def decode(line, cfg):
    """bytes -> vote dict, or raises Reject."""
    inp = cfg["input"]
    if len(line) > inp["max_message_bytes"]:
        raise Reject("too_large")
    if line.startswith(b"\xef\xbb\xbf"):
        raise Reject("malformed_json")
    try:
        text = line.decode("utf-8")
        obj = json.loads(text, parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Reject("malformed_json")
    if not isinstance(obj, dict) or _depth(obj) > 128 or not _finite_floats(obj):
        raise Reject("malformed_json")
    inference_id = id_value(obj, "inference_id")
    voter_id = id_value(obj, "voter_id")
    prompt = id_value(obj, "voter_prompt_id")
    if prompt is None:
        prompt = inp.get("default_voter_prompt_id")
    for name, v in (("inference_id", inference_id), ("voter_id", voter_id),
                    ("voter_prompt_id", prompt)):
        if v is None:
            raise Reject("missing_field", name)
    if "vote" not in obj:
        raise Reject("missing_field", "vote")
    raw = obj["vote"]
    if raw is None:
        value = None
    elif isinstance(raw, bool):
        value = 1.0 if raw else 0.0
    elif is_num(raw):
        if not (math.isfinite(raw) and 0 <= raw <= 1):
            raise Reject("invalid_field", "vote")
        value = float(raw)
    elif isinstance(raw, str):
        lowered = "".join(c.lower() if "A" <= c <= "Z" else c for c in raw)
        if lowered not in LABELS:
            raise Reject("invalid_field", "vote")
        value = LABELS[lowered]
    else:
        raise Reject("invalid_field", "vote")
    if obj.get("timestamp") is not None:
        ts = time_value(obj, "timestamp")
    elif obj.get("vote_time") is not None:
        ts = time_value(obj, "vote_time")
    else:
        raise Reject("missing_field", "timestamp")
    vote_id = id_value(obj, "vote_id")
    model = obj.get("model_id")
    if model is not None:
        if not isinstance(model, str) or not 1 <= len(model.encode("utf-8")) <= 256:
            raise Reject("invalid_field", "model_id")
    rep = obj.get("reputation")
    if rep is None:
        weight = 1.0
    elif is_num(rep) and math.isfinite(rep) and rep > 0:
        weight = float(rep)
    else:
        raise Reject("invalid_field", "reputation")
    inf_time = None
    if obj.get("inference_time") is not None:
        inf_time = time_value(obj, "inference_time")
    return {
        "inference_id": inference_id,
        "voter_id": voter_id,
        "voter_prompt_id": prompt,
        "value": value,
        "ts": ts,
        "vote_id": vote_id,
        "model_id": model,
        "weight": weight,
        "inference_time": inf_time,
    }


def payload_of(line):
    s = line.decode("utf-8", errors="replace").encode("utf-8")
    if len(s) <= 65536:
        return s.decode("utf-8")
    end = 65536
    while end > 0 and (s[end] & 0xC0) == 0x80:
        end -= 1
    return s[:end].decode("utf-8")


# ---------------------------------------------------------------- scoring


def rubric(cfg, prompt):
    sc, amb = cfg["scoring"], cfg["ambiguity"]
    p = {
        "lambda": sc["lambda"],
        "time_unit": sc["time_unit"],
        "variance_threshold": amb["variance_threshold"],
        "aggregator": sc["aggregator"],
        "temperature": sc["temperature"],
    }
    p.update(cfg["rubrics"].get(prompt, {}))
    return p


def power_mean(vals, weights, tau):
    p = -8 + (tau - 0.1) / 0.9 * 20.25
    geometric = abs(p) < 1e-12
    floor = p < 0 or geometric
    wsum = sum(weights)
    xs = [1e-9 if (floor and v == 0) else v for v in vals]
    if geometric:
        big_m = math.exp(sum(w * math.log(x) for x, w in zip(xs, weights)) / wsum)
    else:
        big_m = (sum(w * x ** p for x, w in zip(xs, weights)) / wsum) ** (1 / p)
    none_frac = sum(w for v, w in zip(vals, weights) if v == 0) / wsum
    n = len(vals)
    k = (1.5 - tau) * min(1, (n - 1) / 4)
    return big_m * (1 - none_frac) ** k


Z95 = 1.959963984540054


def certainty(hist, s0):
    """contract §13 from each vote's weight in the score, not by recursion:
    update k's vote i weighs (1 - a_k) * prod(a_j, j > k) * r_i / sum(r);
    V = sum of the weights, effective votes = V^2 / sum of their squares,
    the votes' part of the score p = sum_k (1 - a_k) prod(a_j) agg_k / V,
    and the 95 % Wilson interval for p mapped back onto the score."""
    weights, part = [], 0.0
    for k, (a, rs, agg) in enumerate(hist):
        later = 1.0
        for a_j, _, _ in hist[k + 1:]:
            later *= a_j
        weights += [(1 - a) * later * r for r in rs]
        part += (1 - a) * later * agg
    v = sum(weights)
    q = sum(w * w for w in weights)
    if v == 0 or q == 0:
        return None, None
    n = v * v / q
    p = min(1.0, max(0.0, part / v))
    z2 = Z95 * Z95
    c = (p + z2 / (2 * n)) / (1 + z2 / n)
    h = Z95 / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    prior = (1 - v) * s0
    return n, [prior + v * (c - h), prior + v * (c + h)]


class Reference:
    def __init__(self, cfg):
        self.cfg = cfg
        b = cfg["batching"]
        self.w = to_ns(b["window_seconds"])
        self.grace = to_ns(b["grace_seconds"])
        self.max_votes = b["max_votes"]
        self.retention = to_ns(cfg["dedupe"]["retention_seconds"])
        self.gap = to_ns(cfg["scoring"]["initial_gap_seconds"])
        self.initial = float(cfg["scoring"]["initial_score"])
        self.min_votes = cfg["ambiguity"]["min_votes"]
        self.wm = None
        self.seen = {}  # identity -> vote time
        self.series = {}  # (inf, prompt) -> state
        self.batches = []  # open batches, in opening order
        self.open = {}  # (series, window start) -> batch
        self.seq = 0
        self.events = []

    def start(self, ts):
        return ts if self.w == 0 else ts // self.w * self.w

    def closed(self, s):
        if self.wm is None:
            return False
        return self.wm > s if self.w == 0 else self.wm >= s + self.w

    def vote(self, v, line, raw):
        if v["vote_id"] is not None:
            ident = ("id", v["inference_id"], v["voter_prompt_id"], v["vote_id"])
        else:
            ident = ("tuple", v["inference_id"], v["voter_id"], v["voter_prompt_id"], v["ts"])
        if ident in self.seen and not (
                self.wm is not None and self.wm - self.seen[ident] > self.retention):
            return
        s = self.start(v["ts"])
        if self.closed(s):
            self.reject("late", "timestamp", line, raw)
            return
        self.seen[ident] = v["ts"]
        key = (v["inference_id"], v["voter_prompt_id"])
        st = self.series.setdefault(key, {"model": None, "score": self.initial,
                                          "t_prev": None, "seq": 0})
        if st["model"] is None and v["model_id"] is not None:
            st["model"] = v["model_id"]
        b = self.open.get((key, s))
        if b is None:
            b = {"key": key, "start": s, "seq": self.seq, "entries": []}
            self.seq += 1
            self.open[(key, s)] = b
            self.batches.append(b)
        e = dict(v, live=True)
        for prev in b["entries"]:
            if prev["live"] and prev["voter_id"] == v["voter_id"]:
                if v["ts"] >= prev["ts"]:
                    prev["live"] = False
                else:
                    e["live"] = False
        b["entries"].append(e)
        counted = sum(1 for x in b["entries"] if x["live"] and x["value"] is not None)
        full = None
        if counted >= self.max_votes:
            full = b
            del self.open[(key, s)]
        cand = v["ts"] - self.grace
        if self.wm is None or cand > self.wm:
            self.wm = cand
        ready = [x for x in self.batches if x is full or self.closed(x["start"])]
        self.close(ready)

    def close(self, ready):
        ready.sort(key=lambda x: (x["start"], x["key"][0].encode(), x["key"][1].encode(),
                                  x["seq"]))
        for b in ready:
            self.batches.remove(b)
            if self.open.get((b["key"], b["start"])) is b:
                del self.open[(b["key"], b["start"])]
            self.score(b)

    def finish(self):
        self.close(list(self.batches))

    def score(self, b):
        key, st = b["key"], self.series[b["key"]]
        entries = b["entries"]
        superseded = sum(1 for e in entries if not e["live"])
        abstentions = sum(1 for e in entries if e["live"] and e["value"] is None)
        votes = sorted((e for e in entries if e["live"] and e["value"] is not None),
                       key=lambda e: e["ts"])  # stable: arrival order on ties
        if not votes:
            return
        p = rubric(self.cfg, key[1])
        vals = [e["value"] for e in votes]
        ws = [e["weight"] for e in votes]
        wsum = 0.0
        acc = 0.0
        for v, w in zip(vals, ws):
            wsum += w
            acc += w * v
        mean = acc / wsum
        sq = 0.0
        for v, w in zip(vals, ws):
            sq += w * (v - mean) ** 2
        var = sq / wsum
        agg = mean if p["aggregator"] == "mean" else power_mean(vals, ws, p["temperature"])
        t = max(e["ts"] for e in votes)
        if st["seq"] == 0:
            prev = self.initial
            its = [e["inference_time"] for e in votes if e["inference_time"] is not None]
            t_prev = min(its) if its else t - self.gap
        else:
            prev, t_prev = st["score"], st["t_prev"]
        dt = max(0, t - t_prev)
        dt_s = dt / NS
        alpha = math.exp(-p["lambda"] * (dt_s / UNIT_SECONDS[p["time_unit"]]))
        new = alpha * prev + (1 - alpha) * agg
        amb = len(votes) >= self.min_votes and var > p["variance_threshold"]
        st.setdefault("hist", []).append((alpha, [w / wsum for w in ws], agg))
        eff, interval = certainty(st["hist"], self.initial)
        st["score"], st["t_prev"] = new, t
        st["seq"] += 1
        ids = [e["vote_id"] if e["vote_id"] is not None else DERIVED + "?" for e in votes]
        self.events.append({
            "type": "score_updated", "schema_version": 1, "processed_at": "",
            "inference_id": key[0], "voter_prompt_id": key[1], "model_id": st["model"],
            "update_seq": st["seq"], "score": new, "previous_score": prev,
            "alpha": alpha, "freshness": 1 - alpha, "delta_t_seconds": dt_s,
            "ambiguous": amb,
            "params": {"lambda": p["lambda"], "time_unit": p["time_unit"],
                       "window_seconds": self.cfg["batching"]["window_seconds"],
                       "variance_threshold": p["variance_threshold"],
                       "aggregator": p["aggregator"], "temperature": p["temperature"]},
            "batch": {
                "window_start": fmt_time(b["start"]),
                "window_end": fmt_time(b["start"] + self.w) if self.w > 0 else None,
                "first_vote_at": fmt_time(min(e["ts"] for e in votes)),
                "last_vote_at": fmt_time(t),
                "votes": len(votes), "abstentions": abstentions,
                "superseded": superseded, "weight_sum": wsum, "mean_vote": mean,
                "aggregate": agg, "variance": var, "vote_ids": ids,
            },
            "effective_votes": eff, "score_interval": interval,
        })
        if amb:
            self.events.append({
                "type": "ambiguity_flagged", "schema_version": 1, "processed_at": "",
                "inference_id": key[0], "voter_prompt_id": key[1], "model_id": st["model"],
                "update_seq": st["seq"], "score": new, "variance": var,
                "threshold": p["variance_threshold"], "mean_vote": mean,
                "votes": [{"vote_id": i, "voter_id": e["voter_id"], "value": e["value"],
                           "weight": e["weight"], "timestamp": fmt_time(e["ts"])}
                          for i, e in zip(ids, votes)],
            })

    def reject(self, reason, field, line, raw):
        self.events.append({
            "type": "vote_rejected", "schema_version": 1, "processed_at": "",
            "reason": reason, "detail": field or "", "payload": payload_of(raw),
            "source": {"line": line},
        })


def run_case(case_dir):
    cfg = load_config(os.path.join(case_dir, "config.toml"))
    ref = Reference(cfg)
    with open(os.path.join(case_dir, "input.jsonl"), "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for no, raw in enumerate(lines, start=1):
        if raw.strip(b" \t\r\n\x0c") == b"":
            continue
        try:
            v = decode(raw, cfg)
        except Reject as r:
            ref.reject(r.reason, r.field, no, raw)
            continue
        ref.vote(v, no, raw)
    ref.finish()
    return ref.events


# ---------------------------------------------------------------- compare

TIME_KEYS = {"window_start", "window_end", "first_vote_at", "last_vote_at", "timestamp"}


def _utc(text):
    if not isinstance(text, str) or not re.search(r"([Zz]|[+-]00:00)$", text):
        return None
    return parse_time(text)


def cmp(path, e, a, out, key=None):
    if key in TIME_KEYS and isinstance(e, str):
        if _utc(e) is None or _utc(e) != _utc(a):
            out.append("%s: reference %r, expected.jsonl %r" % (path, e, a))
        return
    if is_num(e) and is_num(a):
        if not math.isclose(e, a, rel_tol=1e-9, abs_tol=1e-9):
            out.append("%s: reference %r, expected.jsonl %r" % (path, e, a))
        return
    if isinstance(e, dict) and isinstance(a, dict):
        for k in set(e) | set(a):
            p = path + "." + k if path else k
            if k not in a or k not in e:
                out.append("%s: only in %s" % (p, "reference" if k in e else "expected.jsonl"))
            elif k == "processed_at":
                if not isinstance(a[k], str):
                    out.append("processed_at: not a string")
            elif k == "detail":
                if not isinstance(a[k], str) or not a[k] or e[k] not in a[k]:
                    out.append("detail: %r does not name %r" % (a[k], e[k]))
            elif k in ("vote_ids", "vote_id") and _derived(e[k]):
                if isinstance(e[k], list) and len(e[k]) != len(a[k]):
                    out.append("%s: %d ids, expected.jsonl %d" % (p, len(e[k]), len(a[k])))
            else:
                cmp(p, e[k], a[k], out, key=k)
        return
    if isinstance(e, list) and isinstance(a, list):
        if len(e) != len(a):
            out.append("%s: %d items, expected.jsonl %d" % (path, len(e), len(a)))
            return
        for i, (x, y) in enumerate(zip(e, a)):
            cmp("%s[%d]" % (path, i), x, y, out, key=key)
        return
    if type(e) is not type(a) or e != a:
        out.append("%s: reference %r, expected.jsonl %r" % (path, e, a))


def _derived(v):
    if isinstance(v, list):
        return any(isinstance(x, str) and x.startswith(DERIVED) for x in v)
    return isinstance(v, str) and v.startswith(DERIVED)


def check(case_dir):
    ours = run_case(case_dir)
    with open(os.path.join(case_dir, "expected.jsonl"), encoding="utf-8") as f:
        theirs = [json.loads(x) for x in f if x.strip()]
    problems = []
    if len(ours) != len(theirs):
        problems.append("reference has %d events, expected.jsonl %d" % (len(ours), len(theirs)))
    for i, (e, a) in enumerate(zip(ours, theirs), start=1):
        d = []
        cmp("", e, a, d)
        if d:
            problems.append("event %d (%s %s/%s): %s" % (
                i, e.get("type"), e.get("inference_id", ""), e.get("voter_prompt_id", ""),
                "; ".join(d[:4])))
    return problems


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    if argv and argv[0] == "--print":
        for ev in run_case(argv[1]):
            print(json.dumps(ev))
        return 0
    if argv == ["--all"] or not argv:
        argv = sorted(os.path.join(here, d) for d in os.listdir(here)
                      if os.path.isfile(os.path.join(here, d, "config.toml")))
    failed = 0
    for case in argv:
        problems = check(case)
        name = os.path.basename(os.path.normpath(case))
        if problems:
            failed += 1
            print("FAIL %s" % name)
            for p in problems[:10]:
                print("    " + p)
        else:
            print("PASS %s (%d events)" % (name, len(run_case(case))))
    print("%d cases, %d failed" % (len(argv), failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
