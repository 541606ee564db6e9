#!/usr/bin/env python3
"""The Label Studio part of scripts/label-studio-demo.sh (standard library only).

With Label Studio, `jurystream run` and `jurystream connect` already
running (the shell script starts them), this:

1. creates a project with examples/label-studio/label-config.xml, imports
   examples/label-studio/tasks.json and points the project's webhook at
   connect (with connect's bearer token as a header);
2. has three reviewers annotate every task: one task disputed (Pass / Flag /
   Flag, scores far apart), one reviewer edits an annotation, one skips a
   task;
3. waits, polling with a deadline, until `run` has scored every series (its
   query API and the scores topic agree) and every ambiguity flag has been
   routed back (the disputed task's overlap raised, is_labeled false);
4. prints the scores, the flags and the disputed task as Label Studio now
   sees it, including what a fourth reviewer is served next.

    label_studio_demo.py --ls-url URL --ls-token T --connect URL --connect-token T
                         --api URL --events FILE [--window S] [--timeout S] [--elapsed S]

--events is the output of a running `jurystream consume --topic <scores>
--topic <flags>` (one event per line).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, os.path.join(ROOT, "tests", "label_studio"))
from ls import LabelStudio, results  # noqa: E402

EXAMPLES = os.path.join(ROOT, "examples", "label-studio")
REVIEWERS = ["alice", "bob", "carol"]
FOURTH = "dave"
# Annotations per task in the project (Label Studio's "overlap").
OVERLAP = 3
RUBRICS = ["verdict", "score", "quality"]

# What each reviewer answers, per task (in tasks.json order):
# (verdict, score, quality) or "skip"; "edit" answers are a second version
# of the same annotation (an edit: a re-vote in jurystream).
PLAN = [
    {"alice": ("Pass", 0.90, 5), "bob": ("Pass", 0.85, 4), "carol": ("Pass", 0.80, 5)},
    # the disputed one: the output promises refunds at any time
    {"alice": ("Pass", 0.80, 3), "bob": ("Flag", 0.30, 2), "carol": ("Flag", 0.10, 2)},
    {"alice": ("Pass", 0.75, 4), "bob": ("Pass", 0.70, 4), "carol": "skip"},
    {"alice": ("Pass", 0.95, 5), "bob": ("Pass", 0.90, 5), "carol": ("Flag", 0.40, 3),
     "edit": ("carol", ("Pass", 0.85, 4))},
]


def say(msg=""):
    print(msg, flush=True)


def http_json(url, token=None, timeout=10):
    """GET url -> (status, JSON or None)."""
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None
    except (urllib.error.URLError, OSError):
        return 0, None


def http_text(url, timeout=10):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()
    except (urllib.error.URLError, OSError):
        return ""


def table(headers, rows, right=()):
    """A plain text table; columns whose index is in `right` are right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r):
        return "  " + "  ".join(c.rjust(w) if i in right else c.ljust(w)
                                for i, (c, w) in enumerate(zip(r, widths))).rstrip()
    out = [line(cells[0]), "  " + "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def fmt(x, digits=3):
    if x is None:
        return "-"
    return f"{x:.{digits}f}"


class Events:
    """The events `jurystream consume` has written so far."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.scores = []
        self.flags = []

    def read(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1  # whole lines only
        self.offset += end
        for line in data[:end].splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("type") == "score_updated":
                self.scores.append(e)
            elif e.get("type") == "ambiguity_flagged":
                self.flags.append(e)


class Demo:
    def __init__(self, a):
        self.a = a
        self.ls = LabelStudio(a.ls_url, a.ls_token)
        self.events = Events(a.events)
        self.t0 = time.monotonic() - a.elapsed
        self.tasks = []      # (task id, data) in tasks.json order
        self.people = {}     # name -> {"id", "token", ...}
        self.names = {}      # "ls:<user id>" -> name
        self.before = {}     # task id -> its task object right after its reviews

    def elapsed(self):
        return f"{time.monotonic() - self.t0:.0f}s"

    # -- 1. project, tasks, webhook, reviewers ------------------------------
    def setup(self):
        config = open(os.path.join(EXAMPLES, "label-config.xml")).read()
        tasks = json.load(open(os.path.join(EXAMPLES, "tasks.json")))
        # The outputs were produced 5 minutes before the reviews (so the
        # example works on any date: an inference_time in the future would
        # leave every score at scoring.initial_score).
        made = (datetime.now(timezone.utc) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
        for t in tasks:
            t["inference_time"] = made
        # A skip counts as that reviewer's turn (skip_queue IGNORE_SKIPPED,
        # jurystream counts it as an abstention), so the only tasks Label
        # Studio serves again are those connect sends back.
        p = self.ls.create_project("jurystream demo: support answers", config,
                                   maximum_annotations=OVERLAP, skip_queue="IGNORE_SKIPPED")
        self.project = p["id"]
        ids = self.ls.import_tasks(self.project, tasks)
        self.tasks = list(zip(ids, tasks))
        hook = self.ls.add_webhook(self.project, self.a.connect.rstrip("/") + "/hooks/label-studio",
                                   headers={"Authorization": f"Bearer {self.a.connect_token}"})
        for name in REVIEWERS + [FOURTH]:
            r = self.ls.create_reviewer(f"{name}@jurystream.test")
            self.people[name] = r
            self.names[f"ls:{r['id']}"] = name
        say(f"  project {self.project} ({len(ids)} tasks, {OVERLAP} annotations per task), "
            f"webhook {hook['id']} -> {hook['url']}")
        say(f"  reviewers: " + ", ".join(f"{n} (user {self.people[n]['id']})" for n in REVIEWERS + [FOURTH]))

    # -- 2. reviews -------------------------------------------------------------
    def align(self, need):
        """Start a task's reviews where `need` seconds remain in the current
        scoring window (batching.window_seconds), so they are scored as one
        batch: the demo's clock and Label Studio's are the same."""
        w = self.a.window
        left = w - (time.time() % w)
        if left < need:
            say(f"  ({left:.1f}s left in this {w:g}s scoring window: waiting for the next one, "
                "so that the task's reviews form one batch)")
            time.sleep(left + 0.05)

    def review(self):
        for (task_id, data), plan in zip(self.tasks, PLAN):
            self.align(self.a.task_seconds)
            started = time.monotonic()
            done = {}
            for name in REVIEWERS:
                answer = plan[name]
                who = self.people[name]["id"]
                if answer == "skip":
                    self.ls.skip(task_id, completed_by=who)
                    done[name] = "skipped"
                else:
                    a = self.ls.annotate(task_id, results(*answer), completed_by=who)
                    done[name] = answer_text(answer)
                    if plan.get("edit", (None,))[0] == name:
                        new = plan["edit"][1]
                        self.ls.update_annotation(a["id"], results(*new))
                        done[name] += f" -> edited to {answer_text(new)}"
            self.before[task_id] = self.ls.task(task_id)
            say(f"  task {task_id} {data['inference_id']}: " + "; ".join(f"{n} {done[n]}" for n in REVIEWERS)
                + f"  ({time.monotonic() - started:.1f}s)")

    # -- 3. wait ------------------------------------------------------------------
    def series(self):
        """The query API's series of every demo inference (None: not there yet)."""
        out = {}
        for _, data in self.tasks:
            iid = data["inference_id"]
            status, body = http_json(f"{self.a.api}/v1/inferences/{urllib.parse.quote(iid, safe='')}")
            for s in (body or {}).get("series", []) if status == 200 else []:
                out[(iid, s["voter_prompt_id"])] = s
        return out

    def wait(self):
        deadline = time.monotonic() + self.a.timeout
        by_inference = {d["inference_id"]: tid for tid, d in self.tasks}
        want = len(self.tasks) * len(RUBRICS)
        last, last_print = None, 0.0
        while True:
            self.events.read()
            series = self.series()
            scored = [s for s in series.values() if s["update_seq"] >= 1 and s["pending_votes"] == 0]
            updates = sum(s["update_seq"] for s in series.values())
            ambiguous = {(e["inference_id"], e["voter_prompt_id"], e["update_seq"])
                         for e in self.events.scores if e["ambiguous"]}
            flagged = {(e["inference_id"], e["voter_prompt_id"], e["update_seq"]) for e in self.events.flags}
            flagged_tasks = sorted({by_inference[f[0]] for f in flagged if f[0] in by_inference})
            routed = []
            for tid in flagged_tasks:
                t = self.ls.task(tid)
                if not t["is_labeled"] and t["overlap"] > self.before[tid]["overlap"]:
                    routed.append(tid)
            done = (len(scored) == want and len(self.events.scores) == updates
                    and ambiguous <= flagged and len(routed) == len(flagged_tasks))
            state = (f"{len(scored)}/{want} series scored, {len(self.events.scores)} score_updated, "
                     f"{len(self.events.flags)} ambiguity_flagged, "
                     f"{len(routed)}/{len(flagged_tasks)} flagged tasks sent back to Label Studio")
            now = time.monotonic()
            if done or state != last or now - last_print >= 5:
                say(f"  [{self.elapsed()}] {state}")
                last, last_print = state, now
            if done:
                return
            if now > deadline:
                raise SystemExit(f"label_studio_demo: gave up after {self.a.timeout:g}s: {state}")
            time.sleep(0.5)

    # -- 4. report ----------------------------------------------------------------
    def report(self):
        model = {d["inference_id"]: d["model_id"] for _, d in self.tasks}
        latest = {}
        for e in self.events.scores:
            k = (e["inference_id"], e["voter_prompt_id"])
            if k not in latest or e["update_seq"] > latest[k]["update_seq"]:
                latest[k] = e
        rows = []
        for (iid, rubric), e in sorted(latest.items()):
            b = e["batch"]
            iv = e.get("score_interval")
            learned = b.get("learned_weights")
            rows.append([iid, model.get(iid, e.get("model_id") or "-"), rubric, e["update_seq"],
                         fmt(e["score"]), f"{fmt(iv[0])}-{fmt(iv[1])}" if iv else "-",
                         fmt(e.get("effective_votes"), 2), b["votes"], b["abstentions"], b["superseded"],
                         " ".join(fmt(w, 2) for w in learned) if learned is not None else "-",
                         fmt(b.get("step"), 3) if "step" in b else "-",
                         "YES" if e["ambiguous"] else "no"])
        say()
        say("Scores (score_updated on the scores topic; the latest update of each series)")
        say(table(["inference", "model", "rubric", "updates", "score", "95% interval", "eff. votes",
                   "votes", "abstained", "re-votes", "learned weights", "step", "ambiguous"], rows,
                  right={3, 4, 6, 7, 8, 9, 11}))
        say("  votes: counted votes of the batch; abstained: skips; re-votes: earlier versions "
            "replaced by an edit; learned weights: each counted vote's learned weight (reputation "
            "mode learned: how far the reviewer's earlier votes fell from the others'), step: the "
            "batch's damped step (docs/operations.md, \"Event fields in learned mode\").")
        if not any("learned_weights" in e["batch"] for e in self.events.scores):
            say("  no score_updated carries learned_weights: is reputation.mode learned?")
            self.failed = True

        rows = []
        for name in REVIEWERS:
            vid = f"ls:{self.people[name]['id']}"
            status, body = http_json(f"{self.a.api}/v1/voters/{urllib.parse.quote(vid, safe='')}")
            for v in (body or {}).get("voters", []) if status == 200 else []:
                rows.append([name, vid, v["voter_prompt_id"], v.get("rated_votes", "-"),
                             fmt(v.get("weight"), 3), v.get("table_until") or "-"])
        say()
        say("Learned reviewer weights (GET /v1/voters/{id}: the group's newest table)")
        if rows:
            say(table(["reviewer", "voter_id", "rubric", "rated votes", "weight", "table until"], rows,
                      right={3, 4}))
        else:
            say("  none yet (no reviewer has a rated vote)")
        say("  weight 1: as the rubric's typical reviewer; below 1: their votes fell further from the "
            "others' than most; a batch of epoch k uses the table of the epochs up to k - 2.")

        status, board = http_json(f"{self.a.api}/v1/leaderboard")
        if status == 200 and board.get("rows"):
            say()
            say("Leaderboard (GET /v1/leaderboard)")
            rows = []
            for r in board["rows"]:
                iv = r.get("mean_score_interval")
                rows.append([r["model_id"] or "-", r["voter_prompt_id"], r["series"], fmt(r["mean_score"]),
                             f"{fmt(max(iv[0], 0))}-{fmt(min(iv[1], 1))}" if iv else "-",
                             r["ambiguous_series"], r["votes"]])
            say(table(["model", "rubric", "inferences", "mean score", "95% interval", "ambiguous", "votes"],
                      rows, right={2, 3, 5, 6}))

        say()
        say(f"Ambiguity flags (ambiguity_flagged on the flags topic: {len(self.events.flags)})")
        for i, f in enumerate(self.events.flags):
            if i:
                say()
            say(f"  {f['inference_id']} / {f['voter_prompt_id']}: variance {fmt(f['variance'])} "
                f"> threshold {fmt(f['threshold'], 2)}, mean vote {fmt(f['mean_vote'])}, "
                f"score {fmt(f['score'])}")
            rows = [[self.names.get(v["voter_id"], v["voter_id"]), v["voter_id"],
                     vote_text(f["voter_prompt_id"], v["value"]), fmt(v["weight"], 1), v["vote_id"]]
                    for v in f["votes"]]
            say(table(["reviewer", "voter_id", "vote", "weight", "vote_id"], rows, right={2, 3}))

        say()
        say("Label Studio tasks")
        rows = []
        for tid, d in self.tasks:
            t = self.ls.task(tid)
            rows.append([tid, d["inference_id"], f"{self.before[tid]['overlap']} -> {t['overlap']}",
                         t["total_annotations"], t["cancelled_annotations"], str(t["is_labeled"]).lower(),
                         max(0, t["overlap"] - t["total_annotations"] - t["cancelled_annotations"])])
        say(table(["task", "inference", "overlap", "annotations", "skipped", "is_labeled", "waiting for"],
                  rows, right={0, 3, 4, 6}))
        say("  (the project counts a skip as that reviewer's turn: skip queue \"Ignore skipped\")")

        by_inference = {d["inference_id"]: (tid, d) for tid, d in self.tasks}
        disputed = sorted({by_inference[f["inference_id"]][0] for f in self.events.flags
                           if f["inference_id"] in by_inference})
        dave = LabelStudio(self.a.ls_url, self.people[FOURTH]["token"])
        served = dave.next_task(self.project)
        for tid in disputed:
            t = self.ls.task(tid)
            iid = t["data"]["inference_id"]
            rubrics = sorted({f["voter_prompt_id"] for f in self.events.flags if f["inference_id"] == iid})
            waiting = t["overlap"] - t["total_annotations"] - t["cancelled_annotations"]
            say()
            say(f"Disputed task {tid} ({iid}, flagged on {', '.join(rubrics)}): sent back by connect")
            say(f"  prompt:  {t['data']['prompt']}")
            say(f"  output:  {t['data']['output']}")
            say(f"  overlap {self.before[tid]['overlap']} -> {t['overlap']}, "
                f"is_labeled {str(self.before[tid]['is_labeled']).lower()} -> {str(t['is_labeled']).lower()}: "
                f"{t['total_annotations']} annotations so far, waiting for {waiting} more "
                f"reviewer{'s' if waiting != 1 else ''}")
            for a in self.ls.get(f"/api/tasks/{tid}/annotations/"):
                who = self.names.get("ls:%s" % a["completed_by"], a["completed_by"])
                say(f"    {who:<6} {result_text(a['result'])}")
            if served and served["id"] == tid:
                say(f"  GET /api/projects/{self.project}/next/ as {FOURTH} (a 4th reviewer) serves task "
                    f"{served['id']} ({served['data']['inference_id']}, {served.get('queue')})")
            else:
                got = f"task {served['id']}" if served else "nothing (404)"
                say(f"  GET /api/projects/{self.project}/next/ as {FOURTH} serves {got}, not task {tid}")
                self.failed = True
        if not disputed:
            say("  no flag: nothing was sent back")
            self.failed = True

        metrics = http_text(f"{self.a.connect.rstrip('/')}/metrics")
        say()
        say(f"connect ({self.a.connect.rstrip('/')}/metrics)")
        say(connect_summary(metrics))

    def run(self):
        self.failed = False
        say(f"==> Label Studio: project, tasks, webhook, reviewers [{self.elapsed()}]")
        self.setup()
        say(f"==> three reviewers annotate every task [{self.elapsed()}]")
        self.review()
        say(f"==> waiting for run's scores and connect's routing [{self.elapsed()}]")
        self.wait()
        self.report()
        return 1 if self.failed else 0


def answer_text(answer):
    v, s, q = answer
    return f"{v} {s:.2f} {q}/5"


def vote_text(rubric, value):
    if value is None:
        return "abstain"
    if rubric == "verdict" and value in (0.0, 1.0):
        return f"{'Pass' if value == 1.0 else 'Flag'} = {value:g}"
    if rubric == "quality":
        return f"{round(value * 4 + 1)}/5 = {value:g}"
    return f"{value:g}"


def result_text(result):
    out = {}
    for r in result:
        v = r.get("value", {})
        if "choices" in v:
            out["verdict"] = v["choices"][0]
        elif "number" in v:
            out["score"] = f"{v['number']:.2f}"
        elif "rating" in v:
            out["quality"] = f"{v['rating']}/5"
    return "  ".join(out.get(k, "-") for k in ("verdict", "score", "quality")) or "(skipped)"


def connect_summary(text):
    vals = {}
    for line in text.splitlines():
        if line.startswith("jurystream_connect_") and " " in line:
            k, v = line.rsplit(" ", 1)
            try:
                vals[k] = float(v)
            except ValueError:
                pass

    def n(name, **labels):
        key = name + ("{" + ",".join('%s="%s"' % kv for kv in sorted(labels.items())) + "}" if labels else "")
        return int(vals.get(key, 0))
    hooks = ", ".join("%s %d" % (a, n("jurystream_connect_webhooks_total", action=a))
                      for a in ("ANNOTATION_CREATED", "ANNOTATION_UPDATED", "ANNOTATIONS_DELETED")
                      if n("jurystream_connect_webhooks_total", action=a))
    produced = {src: n("jurystream_connect_votes_total", result="produced", source=src)
                for src in ("webhook", "sync")}
    rows = [
        ["webhooks received", hooks or "0"],
        ["votes produced", f"{produced['webhook']} from webhooks, {produced['sync']} from sync"],
        ["", "(sync re-reads recently updated annotations; run drops what it has as duplicates"],
        ["", " and counts the rest in jurystream_votes_accepted_total{source=\"sync\"})"],
        ["sync passes", n("jurystream_connect_sync_runs_total", result="ok")],
        ["flags routed", f"{n('jurystream_connect_routing_total', result='requested')} "
                         "(a task's overlap raised, is_labeled false)"],
    ]
    return "\n".join(f"  {k:<18} {v}" for k, v in rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ls-url", required=True)
    ap.add_argument("--ls-token", required=True)
    ap.add_argument("--connect", required=True, help="connect's base URL")
    ap.add_argument("--connect-token", required=True)
    ap.add_argument("--api", required=True, help="run's query API base URL (metrics.listen)")
    ap.add_argument("--events", required=True, help="the file a running `jurystream consume` writes")
    ap.add_argument("--window", type=float, default=10, help="batching.window_seconds")
    ap.add_argument("--task-seconds", type=float, default=3,
                    help="time a task's reviews need inside one window")
    ap.add_argument("--timeout", type=float, default=90, help="how long to wait for scores and routing")
    ap.add_argument("--elapsed", type=float, default=0, help="seconds the demo has run so far (for progress lines)")
    a = ap.parse_args()
    a.api = a.api.rstrip("/")
    sys.exit(Demo(a).run())


if __name__ == "__main__":
    main()
