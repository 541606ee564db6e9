"""The Quix Streams peer of scripts/bench-peer.sh: what a Python
team would build instead of jurystream, on the same broker and input.

    quix_peer.py BROKERS IN_TOPIC OUT_TOPIC GROUP STATE_DIR GUARANTEE

Per vote (the votes topic is keyed by inference_id, so Quix's state, which
is scoped to the message key, holds one entry per rubric of the
inference): the decay of contract §3 applied vote by vote,
S = αS + (1 − α)v, α = exp(−λΔt), λ = 0.01/s, S = 0.5 before the first
vote, Δt since the series' previous vote (0 for the first). State lives in
Quix's RocksDB store (with its changelog topic, as jurystream's); each valid
vote emits one JSON score event to OUT_TOPIC; a line that is not a valid
vote is counted and dropped. GUARANTEE is Quix's `processing_guarantee`
(`at-least-once`, or `exactly-once`, which needs Kafka transactions).

It does less than jurystream: no windows or batches, no duplicate or late
vote detection, no reputation weighting, no variance flags, no dead-letter
topic, no leaderboard or agreement state.
"""

import json
import math
import sys
from datetime import datetime

from quixstreams import Application

LAMBDA_PER_SECOND = 0.01


# contract §1: verdict labels, matched after ASCII lower-casing.
LABELS = {"pass": 1.0, "flag": 0.0, "fully": 1.0, "mostly": 0.9, "partial": 0.7, "minor": 0.3, "none": 0.0}
ABSTAIN = object()


def vote_value(v):
    """The vote's value in [0, 1], ABSTAIN for null, None when invalid."""
    if v is None:
        return ABSTAIN
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)) and 0.0 <= v <= 1.0:
        return float(v)
    if isinstance(v, str):
        return LABELS.get(v.lower())
    return None


def main():
    brokers, in_topic, out_topic, group, state_dir, guarantee = sys.argv[1:7]
    app = Application(
        broker_address=brokers,
        consumer_group=group,
        state_dir=state_dir,
        processing_guarantee=guarantee,
        auto_offset_reset="earliest",
        commit_interval=1.0,
        loglevel="WARNING",
    )
    votes = app.topic(in_topic, value_deserializer="bytes", key_deserializer="bytes")
    scores = app.topic(out_topic, value_serializer="json", key_serializer="bytes")
    bad = [0]

    def score(raw, state):
        try:
            vote = json.loads(raw)
            rubric = vote["voter_prompt_id"]
            at = datetime.fromisoformat(vote["timestamp"]).timestamp()
            value = vote_value(vote["vote"])
            inference = vote["inference_id"]
        except (ValueError, KeyError, TypeError):
            bad[0] += 1
            return None
        if value is None or not isinstance(rubric, str):
            bad[0] += 1
            return None
        if value is ABSTAIN:
            return None
        prev = state.get(rubric)
        s, last = (0.5, at) if prev is None else prev
        alpha = math.exp(-LAMBDA_PER_SECOND * max(0.0, at - last))
        s = alpha * s + (1.0 - alpha) * value
        state.set(rubric, (s, max(at, last)))
        return {
            "event_type": "score_updated",
            "inference_id": inference,
            "voter_prompt_id": rubric,
            "score": s,
            "freshness": 1.0 - alpha,
        }

    sdf = app.dataframe(votes)
    sdf = sdf.apply(score, stateful=True).filter(lambda e: e is not None)
    sdf.to_topic(scores)
    app.run()
    print(f"quix_peer: {bad[0]} invalid lines dropped", file=sys.stderr)


if __name__ == "__main__":
    main()
