#!/usr/bin/env python3
"""Generates a long vote history (JSONL) for the state benchmarks.

    scripts/gen-history.py --inferences 1000000 --out /tmp/history-1m.jsonl

Shape: --inferences inferences created evenly over --days days (default 60),
each voted on by --votes-per-inference (default 3) of 500 voters under one
rubric within 3 minutes of its creation; vote values 0..1 and labels; every
vote has a vote_id; lines in time order. Streams (memory stays flat for any
size) and is deterministic for a given --seed. With --after FILE it instead
writes one vote on a new inference, one second after the last vote of
FILE, to --out (the "one more vote" of the benchmark).
"""
import argparse
import heapq
import json
import random
import sys
import time

LABELS = ["pass", "flag", "mostly", "partial"]
MODELS = ["gpt-4o", "claude-3-5-sonnet", "llama-3-70b", "mistral-large"]
BASE_MS = 1_719_792_000_000  # 2024-07-01T00:00:00Z

_second_cache = {}


def stamp(ms):
    s, frac = divmod(ms, 1000)
    text = _second_cache.get(s)
    if text is None:
        if len(_second_cache) > 100_000:
            _second_cache.clear()
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s))
        _second_cache[s] = text
    return f"{text}.{frac:03d}Z"


def line(inf, voter, vote, ms, vid, model):
    return (
        f'{{"inference_id":"inf-{inf:08d}","voter_id":"voter-{voter:03d}",'
        f'"voter_prompt_id":"accuracy","vote":{vote},"timestamp":"{stamp(ms)}",'
        f'"vote_id":"v-{vid:09d}","model_id":"{model}"}}\n'
    )


def after(path, out):
    last = None
    with open(path, "rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - 4096))
        for raw in f.read().splitlines():
            if raw.strip():
                last = raw
    ts = json.loads(last)["timestamp"]
    t = time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")
    ms = int(time_gm(t)) * 1000 + int(ts[20:23]) + 1000
    out.write(line(99_999_999, 1, 1.0, ms, 999_999_999, MODELS[0]))


def time_gm(t):
    import calendar

    return calendar.timegm(t)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inferences", type=int, default=1_000_000)
    ap.add_argument("--votes-per-inference", type=int, default=3)
    ap.add_argument("--days", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--after", help="write one vote after the last one of this file")
    ap.add_argument("--out", default="-")
    a = ap.parse_args()
    out = sys.stdout if a.out == "-" else open(a.out, "w", buffering=1 << 20)
    if a.after:
        after(a.after, out)
        out.close()
        return
    rnd = random.Random(a.seed)
    step = a.days * 86_400_000 / max(1, a.inferences)
    pending = []  # (ms, seq, text): votes not yet due
    seq = 0
    vid = 0
    lines = 0
    for i in range(a.inferences):
        created = BASE_MS + int(i * step)
        while pending and pending[0][0] <= created:
            out.write(heapq.heappop(pending)[2])
            lines += 1
        model = MODELS[i % 4]
        for voter in rnd.sample(range(500), a.votes_per_inference):
            ms = created + int(rnd.random() * 180_000)
            r = rnd.random()
            vote = f"{rnd.random():.3f}" if r < 0.7 else json.dumps(rnd.choice(LABELS))
            vid += 1
            seq += 1
            heapq.heappush(pending, (ms, seq, line(i, voter, vote, ms, vid, model)))
    while pending:
        out.write(heapq.heappop(pending)[2])
        lines += 1
    if out is not sys.stdout:
        out.close()
    print(f"gen-history: {lines} votes, {a.inferences} inferences over {a.days} days", file=sys.stderr)


if __name__ == "__main__":
    main()
