#!/usr/bin/env python3
"""The Label Studio side of tests/label_studio.rs (SPEC §12), standard
library only. Each step prints one JSON object; the Rust test runs the
broker, `run` and `connect`, and checks Kafka.

    e2e.py --url U --token T scenario --hook URL --hook-token C --state FILE
    e2e.py --url U --token T expected --state FILE        the votes §12 maps
    e2e.py --url U --token T annotate-missed --state FILE  (connect is down)
    e2e.py --url U --token T routed --state FILE          task 1 and next/

`expected` maps every annotation version the scenario made, as Label
Studio answered it, with this file's own reading of §12 (not connect's
code): one vote per result, the first choice as its label, a number as it
is, a rating r of 5 as (r - 1) / 4, a skip as one null vote per control.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ls import LabelStudio, results  # noqa: E402

CONTROLS = ["quality", "score", "verdict"]  # the test label config's


def tasks():
    return [{
        "inference_id": f"ls-inf-{i}",
        "model_id": "model-a" if i % 2 else "model-b",
        "inference_time": "2026-11-25T12:00:00Z",
        "prompt": f"Question {i}?",
        "output": f"Answer {i}.",
    } for i in range(1, 5)]


def load(path):
    with open(path) as f:
        return json.load(f)


def save(path, state):
    with open(path, "w") as f:
        json.dump(state, f, indent=1)


def scenario(ls, a):
    """Three reviewers annotate four tasks: task 1 is disputed (Pass, Flag,
    Flag with far-apart scores), reviewer 1 edits task 2, reviewer 3 skips
    task 3."""
    suffix = os.urandom(4).hex()
    p = ls.create_project(f"jurystream e2e {suffix}")
    task_ids = ls.import_tasks(p["id"], tasks())
    ls.add_webhook(p["id"], a.hook, headers={"Authorization": f"Bearer {a.hook_token}"})
    reviewers = [ls.create_reviewer(f"r{k}-{suffix}@jurystream.test") for k in range(1, 5)]
    versions = []  # every annotation version, as Label Studio answered

    def annotate(task, reviewer, result=None, skip=False):
        if skip:
            ann = ls.skip(task, completed_by=reviewer["id"])
        else:
            ann = ls.annotate(task, result, completed_by=reviewer["id"])
        versions.append(ann)
        return ann

    t1, t2, t3, t4 = task_ids
    r1, r2, r3 = reviewers[:3]
    annotate(t1, r1, results("Pass", 0.9, 5))
    annotate(t1, r2, results("Flag", 0.1, 1))
    annotate(t1, r3, results("Flag", 0.2, 2))
    edited = annotate(t2, r1, results("Flag", 0.3, 2))
    annotate(t2, r2, results("Pass", 0.8, 4))
    annotate(t2, r3, results("Pass", 0.85, 4))
    annotate(t3, r1, results("Pass", 0.7, 4))
    annotate(t3, r2, results("Pass", 0.75, 4))
    annotate(t3, r3, skip=True)
    for r, v in [(r1, ("Pass", 0.9, 5)), (r2, ("Pass", 0.95, 5)), (r3, ("Pass", 0.9, 4))]:
        annotate(t4, r, results(*v))
    # Reviewer 1 changes their mind on task 2.
    versions.append(ls.update_annotation(edited["id"], results("Pass", 0.8, 4)))
    state = {
        "project": p["id"],
        "tasks": task_ids,
        "reviewers": reviewers,
        "versions": versions,
        "overlap_before": ls.task(t1)["overlap"],
    }
    save(a.state, state)
    return {"project": p["id"], "tasks": task_ids, "versions": len(versions)}


def vote_of(project, task, ann, control, value):
    vote = {
        "inference_id": task["data"]["inference_id"],
        "voter_id": f"ls:{ann['completed_by'] if not isinstance(ann['completed_by'], dict) else ann['completed_by']['id']}",
        "voter_prompt_id": control,
        "vote": value,
        "timestamp": ann["updated_at"],
        "vote_id": f"ls:{project}:{ann['id']}:{control}@{ann['updated_at']}",
        "model_id": task["data"]["model_id"],
        "inference_time": task["data"]["inference_time"],
    }
    return vote


def expected(ls, a):
    state = load(a.state)
    project = state["project"]
    out = []
    tasks_by_id = {}
    for ann in state["versions"] + state.get("missed", []):
        t = ann["task"]
        if t not in tasks_by_id:
            tasks_by_id[t] = ls.task(t)
        task = tasks_by_id[t]
        if ann.get("was_cancelled"):
            out += [vote_of(project, task, ann, c, None) for c in CONTROLS]
            continue
        for r in ann["result"]:
            kind, value = r["type"], r["value"]
            if kind == "choices":
                v = value["choices"][0]
            elif kind == "number":
                v = value["number"]
            elif kind == "rating":
                v = (value["rating"] - 1) / 4
            else:
                continue
            out.append(vote_of(project, task, ann, r["from_name"], v))
    return {"votes": out}


def annotate_missed(ls, a):
    """Reviewer 4 annotates task 4 while connect is down."""
    state = load(a.state)
    r4 = state["reviewers"][3]
    ann = ls.annotate(state["tasks"][3], results("Flag", 0.4, 3), completed_by=r4["id"])
    state["missed"] = [ann]
    save(a.state, state)
    return {"annotation": ann["id"], "updated_at": ann["updated_at"]}


def routed(ls, a):
    """Task 1 as Label Studio holds it now, and what next/ serves a reviewer
    who has not seen it (reviewer 4 has not annotated task 1)."""
    state = load(a.state)
    t1 = ls.task(state["tasks"][0])
    r4 = state["reviewers"][3]
    served = LabelStudio(ls.url, r4["token"]).next_task(state["project"])
    return {
        "task": t1["id"],
        "overlap_before": state["overlap_before"],
        "overlap": t1["overlap"],
        "is_labeled": t1["is_labeled"],
        "total_annotations": t1["total_annotations"],
        "served": served["id"] if served else None,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("scenario")
    s.add_argument("--hook", required=True)
    s.add_argument("--hook-token", required=True)
    s.add_argument("--state", required=True)
    for name in ["expected", "annotate-missed", "routed"]:
        sub.add_parser(name).add_argument("--state", required=True)
    a = ap.parse_args()
    ls = LabelStudio(a.url, a.token)
    fn = {"scenario": scenario, "expected": expected,
          "annotate-missed": annotate_missed, "routed": routed}[a.cmd]
    print(json.dumps(fn(ls, a)))


if __name__ == "__main__":
    main()
