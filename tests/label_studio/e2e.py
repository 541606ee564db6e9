#!/usr/bin/env python3
"""The Label Studio side of tests/label_studio.rs (contract §12), standard
library only. Each step prints one JSON object; the Rust test runs the
broker, `run` and `connect`, and checks Kafka.

    e2e.py --url U --token T scenario --hook URL --hook-token C --state FILE
    e2e.py --url U --token T expected --state FILE        the votes §12 maps
    e2e.py --url U --token T annotate-missed --state FILE  (connect is down)
    e2e.py --url U --token T routed --state FILE          task 1 and next/
    e2e.py --url U --token T reviewers --hook URL --hook-token C --state FILE
                                               a project, 8 tasks, 4 reviewers
    e2e.py --url U --token T annotate-loop --state FILE --count N --interval-ms M [--start K]
                                               N annotations (from the K-th), one every M ms
    e2e.py --url U --token T skips --hook URL --hook-token C --state FILE
                                               a disputed, skipped task per
                                               skip setting
    e2e.py --url U --token T skip-overlaps --state FILE   their overlaps now

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


def reviewers(ls, a):
    """A project of eight tasks with the webhook, and four reviewers who
    have annotated nothing yet (the rolling-restart test)."""
    suffix = os.urandom(4).hex()
    p = ls.create_project(f"jurystream rolling {suffix}")
    many = [dict(t, inference_id=f"{t['inference_id']}-{k}") for k in range(2) for t in tasks()]
    task_ids = ls.import_tasks(p["id"], many)
    ls.add_webhook(p["id"], a.hook, headers={"Authorization": f"Bearer {a.hook_token}"})
    people = [ls.create_reviewer(f"q{k}-{suffix}@jurystream.test") for k in range(1, 5)]
    save(a.state, {"project": p["id"], "tasks": task_ids, "reviewers": people, "versions": []})
    return {"project": p["id"], "tasks": len(task_ids)}


def annotate_loop(ls, a):
    """Annotation k: task k mod 8 by reviewer k div 8 (each pair once),
    one every --interval-ms, as reviewers working while connect restarts."""
    import time
    state = load(a.state)
    task_ids, people = state["tasks"], state["reviewers"]
    assert a.start + a.count <= len(task_ids) * len(people), "each (task, reviewer) once"
    verdicts = [("Pass", 0.9, 5), ("Flag", 0.2, 2), ("Pass", 0.7, 4)]
    for k in range(a.start, a.start + a.count):
        task, who = task_ids[k % len(task_ids)], people[k // len(task_ids)]
        ann = ls.annotate(task, results(*verdicts[k % 3]), completed_by=who["id"])
        state["versions"].append(ann)
        time.sleep(a.interval_ms / 1000)
    save(a.state, state)
    return {"annotations": len(state["versions"])}


SKIP_SETTINGS = ["IGNORE_SKIPPED", "REQUEUE_FOR_OTHERS"]


def skips(ls, a):
    """One project per skip setting (`skip_queue`), one task each: three
    reviewers disagree on it (Pass, Flag, Flag) and a fourth skips it."""
    suffix = os.urandom(4).hex()
    people = [ls.create_reviewer(f"s{k}-{suffix}@jurystream.test") for k in range(1, 5)]
    out = {}
    for setting in SKIP_SETTINGS:
        p = ls.create_project(f"jurystream skips {setting} {suffix}", skip_queue=setting)
        assert ls.project(p["id"])["skip_queue"] == setting, "Label Studio kept the setting"
        task = dict(tasks()[0], inference_id=f"skip-{setting.lower()}-{suffix}")
        (t,) = ls.import_tasks(p["id"], [task])
        ls.add_webhook(p["id"], a.hook, headers={"Authorization": f"Bearer {a.hook_token}"})
        for who, v in zip(people, [("Pass", 0.9, 5), ("Flag", 0.1, 1), ("Flag", 0.2, 2)]):
            ls.annotate(t, results(*v), completed_by=who["id"])
        ls.skip(t, completed_by=people[3]["id"])
        seen = ls.task(t)
        out[setting] = {"project": p["id"], "task": t, "overlap_before": seen["overlap"],
                        "total_annotations": seen["total_annotations"],
                        "cancelled_annotations": seen["cancelled_annotations"]}
    save(a.state, out)
    return out


def skip_overlaps(ls, a):
    return {setting: ls.task(v["task"])["overlap"] for setting, v in load(a.state).items()}


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
    for name in ["expected", "annotate-missed", "routed", "skip-overlaps"]:
        sub.add_parser(name).add_argument("--state", required=True)
    r = sub.add_parser("reviewers")
    r.add_argument("--hook", required=True)
    r.add_argument("--hook-token", required=True)
    r.add_argument("--state", required=True)
    sk = sub.add_parser("skips")
    sk.add_argument("--hook", required=True)
    sk.add_argument("--hook-token", required=True)
    sk.add_argument("--state", required=True)
    loop = sub.add_parser("annotate-loop")
    loop.add_argument("--state", required=True)
    loop.add_argument("--count", type=int, required=True)
    loop.add_argument("--interval-ms", type=int, default=100)
    loop.add_argument("--start", type=int, default=0)
    a = ap.parse_args()
    ls = LabelStudio(a.url, a.token)
    fn = {"scenario": scenario, "expected": expected,
          "annotate-missed": annotate_missed, "routed": routed,
          "reviewers": reviewers, "annotate-loop": annotate_loop,
          "skips": skips, "skip-overlaps": skip_overlaps}[a.cmd]
    print(json.dumps(fn(ls, a)))


if __name__ == "__main__":
    main()
