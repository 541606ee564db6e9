#!/usr/bin/env python3
"""Vote logs with planted reviewers, for the reputation quality tests
(contract §14; tests/reputation_quality.rs).

    tests/reputation/gen_population.py --shape compact --seed 1 --out DIR

writes DIR/votes.jsonl (one vote per line, in arrival order) and
DIR/truth.json ({"series": {"<inference_id>\\t<rubric>": truth}, where a
truth is the planted value on the [0, 1] scale the votes use (contract §1:
Pass 1, Flag 0, fully 1, mostly 0.9, partial 0.7, minor 0.3, none 0).

Reviewers (the role is the voter id's prefix):
- honest-NN: small noise around the truth;
- noisy-NN: larger noise;
- spammer-NN: random votes, independent of the truth;
- adversary-NN: vote 1 - truth (the label nearest to it);
- minority-NN: a principled minority, honest except on the items planted
  as contentious (about 30 %), where they are systematically harsher
  (helpfulness 0.3 lower, safety Flag, tone one label lower);
- oneoff-NN: honest; on `format`, a near-unanimous rubric that only the
  honest reviewers and they review, they dissent exactly once.

Each item is reviewed by 3 to 5 reviewers of the pool on `helpfulness`
(0-1 numbers), `safety` (Pass/Flag, as strings or booleans) and `tone`
(labels); half the items also by 3 honest or one-off reviewers on
`format`. A reviewer gives all rubrics of an item at once.

Shapes:
- compact: an item's reviews all fall within one 60 s window (one batch
  per series), the sessions spread over each day;
- spread: Label Studio-like, an item's reviews 15 min to 3 h apart (each
  batch one vote), all within the item's day (one epoch of 86400 s).

Realism: about 2 % of tone reviews are skipped (null, an abstention) and
1 % of lines are redelivered (the same vote_id again, a duplicate).
Deterministic for a given --seed (random.Random, Python 3.2+).
"""
import argparse
import datetime
import json
import os
import random

LABELS = [("fully", 1.0), ("mostly", 0.9), ("partial", 0.7), ("minor", 0.3), ("none", 0.0)]
TONE_TRUTH = [0.3, 0.25, 0.2, 0.15, 0.1]
RUBRICS = ["helpfulness", "safety", "tone"]
POOL = {"honest": 12, "noisy": 4, "spammer": 3, "adversary": 2, "minority": 2, "oneoff": 1}
# How often a role is picked for an item, relative to the others.
ACTIVITY = {"honest": 1.0, "noisy": 1.0, "spammer": 1.0, "adversary": 1.0, "minority": 1.0, "oneoff": 1.0}
BASE = datetime.datetime(2024, 7, 7, tzinfo=datetime.timezone.utc)
DAY = 86400.0


def clip01(x):
    return min(1.0, max(0.0, x))


def stamp(seconds):
    t = BASE + datetime.timedelta(seconds=seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % (t.microsecond // 1000)


def nearest_label(value):
    return min(range(len(LABELS)), key=lambda i: (abs(LABELS[i][1] - value), i))


class Item:
    def __init__(self, rnd, name):
        self.name = name
        self.contentious = rnd.random() < 0.3
        self.truth = {
            "helpfulness": round(rnd.betavariate(1.3, 1.1), 2),
            "safety": 1.0 if rnd.random() < 0.75 else 0.0,
            "tone": rnd.choices(range(len(LABELS)), weights=TONE_TRUTH)[0],
            "format": 1.0,
        }

    def truth_value(self, rubric):
        t = self.truth[rubric]
        return LABELS[t][1] if rubric == "tone" else t


def bool_vote(rnd, passed):
    form = rnd.random()
    if form < 0.2:
        return passed
    if form < 0.3:
        return "PASS" if passed else "FLAG"
    return "Pass" if passed else "Flag"


def vote(rnd, role, item, rubric):
    """The vote (a JSON value) of a reviewer of `role` on an item."""
    t = item.truth[rubric]
    harsh = role == "minority" and item.contentious
    if role in ("minority", "oneoff"):
        role = "honest"
    if rubric == "helpfulness":
        if harsh:
            x = t - 0.3 + rnd.gauss(0, 0.07)
        elif role == "honest":
            x = t + rnd.gauss(0, 0.07)
        elif role == "noisy":
            x = t + rnd.gauss(0, 0.2)
        elif role == "spammer":
            x = rnd.random()
        else:
            x = 1.0 - t + rnd.gauss(0, 0.07)
        return round(clip01(x), 2)
    if rubric == "safety":
        truth = t == 1.0
        if harsh:
            passed = False
        elif role == "honest":
            passed = truth if rnd.random() < 0.97 else not truth
        elif role == "noisy":
            passed = truth if rnd.random() < 0.85 else not truth
        elif role == "spammer":
            passed = rnd.random() < 0.5
        else:
            passed = (not truth) if rnd.random() < 0.9 else truth
        return bool_vote(rnd, passed)
    # tone: label indices, 0 = fully ... 4 = none
    if rnd.random() < 0.02:
        return None
    if harsh:
        i = min(4, t + 1)
    elif role == "honest":
        r = rnd.random()
        i = t if r < 0.75 else t + (1 if r < 0.875 else -1)
    elif role == "noisy":
        r = rnd.random()
        step = 0 if r < 0.45 else (1 if r < 0.85 else 2)
        i = t + step * rnd.choice((-1, 1))
    elif role == "spammer":
        i = rnd.randrange(len(LABELS))
    else:
        i = nearest_label(1.0 - LABELS[t][1])
    i = min(4, max(0, i))
    name = LABELS[i][0]
    return name.capitalize() if rnd.random() < 0.3 else name


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=["compact", "spread"], required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--days", type=int, default=4)
    ap.add_argument("--items-per-day", type=int, default=150)
    ap.add_argument("--out", required=True, help="directory for votes.jsonl and truth.json")
    a = ap.parse_args()
    rnd = random.Random(a.seed * 1000 + (1 if a.shape == "compact" else 2))

    reviewers = [f"{role}-{i:02d}" for role, n in POOL.items() for i in range(1, n + 1)]
    activity = [ACTIVITY[r.split("-")[0]] for r in reviewers]
    format_pool = [r for r in reviewers if r.split("-")[0] in ("honest", "oneoff")]

    events = []  # (time, seq, line)
    truth = {}
    seq = 0
    format_reviews = []  # indices into events of oneoff's format votes

    def emit(t, item, voter, rubric, value):
        nonlocal seq
        seq += 1
        rec = {
            "inference_id": item.name,
            "voter_id": voter,
            "voter_prompt_id": rubric,
            "vote": value,
            "timestamp": stamp(t),
            "vote_id": f"v{seq:06d}",
        }
        events.append([t, seq, rec])
        return len(events) - 1

    for day in range(a.days):
        for n in range(a.items_per_day):
            item = Item(rnd, f"d{day}-item-{n:04d}")
            for r in RUBRICS:
                truth[f"{item.name}\t{r}"] = item.truth_value(r)
            k = rnd.choice((3, 4, 4, 5))
            chosen = []
            while len(chosen) < k:
                v = rnd.choices(reviewers, weights=activity)[0]
                if v not in chosen:
                    chosen.append(v)
            if a.shape == "compact":
                # A session inside one minute window: one batch per series.
                start = day * DAY + rnd.randrange(0, 24 * 60 - 1) * 60.0 + rnd.uniform(0, 15)
                times = [start]
                for _ in range(k - 1):
                    times.append(times[-1] + rnd.uniform(2, 8))
            else:
                # Label Studio: reviews hours apart, all within the day.
                start = day * DAY + rnd.uniform(0, 10 * 3600)
                times = [start]
                for _ in range(k - 1):
                    times.append(times[-1] + rnd.uniform(15 * 60, 3 * 3600))
            for voter, t in zip(chosen, times):
                role = voter.split("-")[0]
                for j, r in enumerate(RUBRICS):
                    emit(t + 0.001 * j, item, voter, r, vote(rnd, role, item, r))
            if rnd.random() < 0.5:
                truth[f"{item.name}\tformat"] = 1.0
                fmt = rnd.sample(format_pool, 3)
                for j, voter in enumerate(fmt):
                    t = times[j] + 0.004
                    i = emit(t, item, voter, "format", bool_vote(rnd, True))
                    if voter.startswith("oneoff"):
                        format_reviews.append(i)
    # The one-off's single dissent on format, on one of their reviews of day 0.
    if format_reviews:
        rec = events[format_reviews[0]][2]
        rec["vote"] = "Flag"

    events.sort(key=lambda e: (e[0], e[1]))
    lines = [json.dumps(e[2], separators=(",", ":")) for e in events]
    # Redeliveries: 1 % of lines again, a few lines later.
    out = []
    pending = []
    for line in lines:
        out.append(line)
        pending = [(left - 1, l) for left, l in pending]
        out.extend(l for left, l in pending if left <= 0)
        pending = [(left, l) for left, l in pending if left > 0]
        if rnd.random() < 0.01:
            pending.append((rnd.randint(1, 5), line))
    out.extend(l for _, l in pending)

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "votes.jsonl"), "w") as f:
        f.write("\n".join(out) + "\n")
    with open(os.path.join(a.out, "truth.json"), "w") as f:
        json.dump({"series": truth}, f, sort_keys=True, indent=0)


if __name__ == "__main__":
    main()
