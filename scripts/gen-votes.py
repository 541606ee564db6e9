#!/usr/bin/env python3
"""Generates a benchmark vote file (JSONL) on stdout or into a file.

    scripts/gen-votes.py --votes 1000000 --out /tmp/votes-1m.jsonl

Shape: ~votes/5 inferences, each voted on by about 5 of 500
voters under one of 3 rubrics within a few minutes of its creation, the
inferences spread over 6 hours; 2% bad lines; lines in arrival order (by
timestamp, with a little jitter that stays inside the grace period).
Deterministic for a given --seed.
"""
import argparse
import datetime
import json
import random
import sys

LABELS = ["pass", "flag", "Fully", "mostly", "partial", "minor", "none"]
MODELS = ["gpt-4o", "claude-3-5-sonnet", "llama-3-70b", "mistral-large"]
RUBRICS = ["accuracy", "helpfulness", "safety"]
BAD = [
    '{"inference_id": "x", "vote": ',
    "not json at all",
    '{"inference_id": "inf-1", "voter_id": "v1", "voter_prompt_id": "accuracy", "vote": 7, "timestamp": "2024-07-07T00:00:00Z"}',
    '{"inference_id": "inf-1", "voter_id": "v1", "voter_prompt_id": "accuracy", "vote": 1, "timestamp": "yesterday"}',
    '{"voter_id": "v1", "voter_prompt_id": "accuracy", "vote": 1, "timestamp": "2024-07-07T00:00:00Z"}',
    "[1, 2, 3]",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--votes", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", default="-")
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    n_inf = max(1, a.votes // 5)
    base = datetime.datetime(2024, 7, 7, tzinfo=datetime.timezone.utc).timestamp()
    span = 6 * 3600.0
    events = []
    vid = 0
    for i in range(n_inf):
        created = base + rnd.random() * span
        rubric = RUBRICS[i % 3]
        model = MODELS[i % 4]
        for voter in rnd.sample(range(500), 5):
            t = created + rnd.random() * 180.0
            r = rnd.random()
            if r < 0.6:
                vote = round(rnd.random(), 3)
            elif r < 0.9:
                vote = rnd.choice(LABELS)
            elif r < 0.95:
                vote = rnd.random() < 0.5
            else:
                vote = None
            vid += 1
            events.append((t, i, voter, rubric, model, vote, vid))
    # arrival order: by time plus jitter below the 5 s grace
    events.sort(key=lambda e: e[0] + rnd.random() * 2.0)
    out = sys.stdout if a.out == "-" else open(a.out, "w")
    n_bad = 0
    for k, (t, i, voter, rubric, model, vote, vid) in enumerate(events[: a.votes]):
        if rnd.random() < 0.02:
            out.write(rnd.choice(BAD) + "\n")
            n_bad += 1
            continue
        ts = datetime.datetime.fromtimestamp(t, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        rec = {
            "inference_id": f"inf-{i:07d}",
            "voter_id": f"voter-{voter:03d}",
            "voter_prompt_id": rubric,
            "vote": vote,
            "timestamp": ts,
            "vote_id": f"v-{vid:08d}",
            "model_id": model,
        }
        if vid % 7 == 0:
            rec["reputation"] = round(0.5 + rnd.random(), 2)
        out.write(json.dumps(rec, separators=(",", ":")) + "\n")
    if out is not sys.stdout:
        out.close()
    print(f"gen-votes: {a.votes} lines, {n_bad} bad, {n_inf} inferences", file=sys.stderr)


if __name__ == "__main__":
    main()
