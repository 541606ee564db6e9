#!/usr/bin/env python3
"""Drive a Label Studio (1.23.2) through its HTTP API, for tests and demos.

Standard library only. Start a test server with scripts/label-studio.sh
(`eval "$(scripts/label-studio.sh env PORT)"` gives LS_URL and LS_TOKEN);
docs/label-studio.md lists the API calls this module makes and what they
answer.

As a module::

    from ls import LabelStudio, results
    ls = LabelStudio(url, token)                       # legacy "Token …"
    p = ls.create_project("demo")                      # test label config
    ids = ls.import_tasks(p["id"], [task, …])          # -> task ids
    r = ls.create_reviewer("r1@jurystream.test")       # {"id", "email", "token"}
    a = ls.annotate(ids[0], results("Pass", 0.8, 4), completed_by=r["id"])
    ls.update_annotation(a["id"], results("Flag", 0.1, 2))
    ls.skip(ids[1], completed_by=r["id"])
    ls.add_webhook(p["id"], "http://127.0.0.1:9465/hooks/label-studio")
    ls.route(ids[0], overlap=3)                        # more reviews
    LabelStudio(url, r["token"]).next_task(p["id"])    # what r is served

As a command (prints JSON; --url/--token default to $LS_URL/$LS_TOKEN)::

    ls.py create-project --title T [--label-config FILE]
    ls.py import-tasks --project P [--count N | --file TASKS.json]
    ls.py create-reviewer --email E [--password PW]
    ls.py create-user --email E          admin route, no credentials
    ls.py annotate --task T [--as-user U] [--verdict Pass|Flag] [--score X] [--quality N]
    ls.py update-annotation --annotation A [--as-user U] [--verdict …] [--score …] [--quality …]
    ls.py skip --task T [--as-user U]
    ls.py delete-annotation --annotation A | annotation --annotation A
    ls.py add-webhook --project P --hook-url HOOK [--header K=V …]
    ls.py task --task T                  overlap, is_labeled, total_annotations, …
    ls.py route --task T --overlap N     PATCH overlap + is_labeled=false
    ls.py next --project P --reviewer-token TOKEN
    ls.py sync --project P [--since 2026-11-26T01:19:30.000000Z] [--page-size N]
    ls.py projects | project --project P
    ls.py pat                            create a personal access token (409: has one)
    ls.py access --refresh PAT           exchange it for an access token
    ls.py demo [--hook URL]              a project, tasks, 3 reviewers, votes
    ls.py sink --port P --out FILE [--status 200] [--delay S] [--status-file F]
                                         a webhook receiver writing NDJSON

Reviewers: `create-reviewer` signs a user up through the organization's
invite link (GET /api/invite, then the /user/signup/ form), which leaves a
user with a password, the organization active (so its annotations fire
webhooks) and a session; the session reads the user's legacy API token
(GET /api/current-user/token), so tests can call next/ as that user.
`create_user` is the admin-only alternative (POST /api/users/ then PATCH
active_organization): fine for `completed_by`, but the user has no
credentials.
"""
from __future__ import annotations

import argparse
import http.cookiejar
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

# The test project: what the webhook fixtures in /work/shared/label-studio
# were made with, minus the `support` control.
TEST_LABEL_CONFIG = """<View>
  <Header value="Prompt"/>
  <Text name="prompt" value="$prompt"/>
  <Header value="Model output"/>
  <Text name="output" value="$output"/>
  <Choices name="verdict" toName="output" choice="single" required="true">
    <Choice value="Pass"/>
    <Choice value="Flag"/>
  </Choices>
  <Number name="score" toName="output" min="0" max="1" step="0.01"/>
  <Rating name="quality" toName="output" maxRating="5"/>
</View>"""

# The API accepts these actions for a connect webhook.
WEBHOOK_ACTIONS = ["ANNOTATION_CREATED", "ANNOTATION_UPDATED", "ANNOTATIONS_DELETED"]

# Datetime filters of the tasks API parse exactly this format.
LS_DATETIME = "%Y-%m-%dT%H:%M:%S.%fZ"


class ApiError(Exception):
    def __init__(self, method, path, status, body):
        super().__init__(f"{method} {path} -> {status}: {body}")
        self.status = status
        self.body = body


def results(verdict=None, score=None, quality=None, to_name="output"):
    """An annotation's `result` list for the test label config."""
    out = []
    if verdict is not None:
        out.append({"from_name": "verdict", "to_name": to_name, "type": "choices",
                    "value": {"choices": [verdict]}})
    if score is not None:
        out.append({"from_name": "score", "to_name": to_name, "type": "number",
                    "value": {"number": score}})
    if quality is not None:
        out.append({"from_name": "quality", "to_name": to_name, "type": "rating",
                    "value": {"rating": quality}})
    return out


def sample_tasks(n, start=0, model_id="model-a"):
    """n tasks with the data fields connect maps."""
    return [{
        "inference_id": f"inf-{i:05d}",
        "model_id": model_id,
        "inference_time": "2026-11-25T12:00:00Z",
        "prompt": f"Question {i}?",
        "output": f"Answer {i}.",
    } for i in range(start, start + n)]


class LabelStudio:
    """A Label Studio API client. `scheme` is "Token" (legacy API token) or
    "Bearer" (a personal access token's short-lived access token)."""

    def __init__(self, url, token=None, scheme="Token", timeout=30.0):
        self.url = url.rstrip("/")
        self.token = token
        self.scheme = scheme
        self.timeout = timeout
        self.cookies = http.cookiejar.CookieJar()
        self._opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    # -- HTTP -------------------------------------------------------------
    def request(self, method, path, body=None, query=None, headers=None, raw=False, auth=True):
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None
        hdrs = {"Accept": "application/json"}
        if body is not None:
            if isinstance(body, (bytes, str)):
                data = body.encode() if isinstance(body, str) else body
            else:
                data = json.dumps(body).encode()
                hdrs["Content-Type"] = "application/json"
        if auth and self.token:
            hdrs["Authorization"] = f"{self.scheme} {self.token}"
        hdrs.update(headers or {})
        req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                payload = resp.read()
                status = resp.status
        except urllib.error.HTTPError as e:
            payload = e.read()
            if raw:
                return e.code, payload
            raise ApiError(method, path, e.code, payload.decode(errors="replace")[:2000]) from None
        if raw:
            return status, payload
        return json.loads(payload) if payload else None

    def get(self, path, **query):
        return self.request("GET", path, query=query or None)

    # -- projects and tasks ---------------------------------------------
    def create_project(self, title, label_config=TEST_LABEL_CONFIG, **extra):
        return self.request("POST", "/api/projects/",
                            {"title": title, "label_config": label_config, **extra})

    def projects(self, page_size=100):
        """Every project the token can read (follows pagination)."""
        page, out = 1, []
        while True:
            resp = self.get("/api/projects/", page=page, page_size=page_size)
            out.extend(resp["results"])
            if not resp.get("next"):
                return out
            page += 1

    def project(self, project_id):
        return self.get(f"/api/projects/{project_id}/")

    def import_tasks(self, project_id, tasks):
        """Import tasks (a list of data dicts); returns their ids."""
        resp = self.request("POST", f"/api/projects/{project_id}/import",
                            [{"data": t} if "data" not in t else t for t in tasks],
                            query={"return_task_ids": "true"})
        return resp["task_ids"]

    def task(self, task_id):
        return self.get(f"/api/tasks/{task_id}/")

    def route(self, task_id, overlap):
        """Ask Label Studio for more reviews of a task."""
        return self.request("PATCH", f"/api/tasks/{task_id}/", {"overlap": overlap, "is_labeled": False})

    def next_task(self, project_id):
        """The task Label Studio serves next to this client's user (None if none)."""
        try:
            return self.get(f"/api/projects/{project_id}/next/")
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    # The fields sync needs. `include` applies at both levels: the task's id,
    # data, updated_at, and each embedded annotation's id, completed_by,
    # updated_at, was_cancelled, result (8x smaller, ~3x faster than all).
    SYNC_INCLUDE = "id,data,updated_at,annotations,completed_by,was_cancelled,result"

    def tasks_page(self, project_id, since=None, page=1, page_size=100, op="greater",
                   include=SYNC_INCLUDE):
        """One page of a project's tasks, oldest update first, with their
        annotations (skipped ones too) embedded (fields=all); with `since`
        (a LS_DATETIME string: microseconds and Z are required) only tasks
        whose updated_at is `op` since. An annotation's create, edit or
        delete moves its task's updated_at."""
        query = {"ordering": ["tasks:updated_at"]}
        if since:
            query["filters"] = {"conjunction": "and", "items": [{
                "filter": "filter:tasks:updated_at", "operator": op,
                "type": "Datetime", "value": since}]}
        q = {"project": project_id, "fields": "all", "page": page, "page_size": page_size,
             "query": json.dumps(query, separators=(",", ":"))}
        if include:
            q["include"] = include
        return self.request("GET", "/api/tasks/", query=q)

    def sync(self, project_id, since=None, page_size=100):
        """Every annotation of the tasks updated at or after `since`, with
        task data: keyset pagination on updated_at (page 1 each time, the
        cursor moving to the last task seen), so tasks edited while we page
        cannot shift past us; page numbers only step over a full page of
        equal timestamps."""
        out, seen, cursor, page = [], set(), since, 1
        while True:
            resp = self.tasks_page(project_id, cursor, page, page_size, op="greater_or_equal")
            tasks = resp["tasks"]
            fresh = [t for t in tasks if (t["id"], t["updated_at"]) not in seen]
            for t in fresh:
                seen.add((t["id"], t["updated_at"]))
                for a in t.get("annotations", []):
                    out.append({"task": t["id"], "data": t["data"], "task_updated_at": t["updated_at"],
                                **{k: a.get(k) for k in ("id", "completed_by", "updated_at",
                                                         "was_cancelled", "result")}})
            if len(tasks) < page_size:
                return out
            if tasks[-1]["updated_at"] == cursor:
                page += 1  # a whole page of one timestamp
            else:
                cursor, page = tasks[-1]["updated_at"], 1

    # -- users --------------------------------------------------------------
    def create_user(self, email, **extra):
        """Admin route: a user without credentials, active in the admin's
        organization (without the PATCH, its annotations fire no webhook)."""
        user = self.request("POST", "/api/users/", {"email": email, "username": email, **extra})
        org = self.get("/api/current-user/whoami")["active_organization"]
        return self.request("PATCH", f"/api/users/{user['id']}/", {"active_organization": org})

    def create_reviewer(self, email, password="reviewer-password-1"):
        """Sign a user up through the invite link; returns {id, email, token}
        where token is the reviewer's legacy API token."""
        invite = self.get("/api/invite")  # {"token": …, "invite_url": "/user/signup/?token=…"}
        anon = LabelStudio(self.url, timeout=self.timeout)
        signup = f"/user/signup/?token={invite['token']}"
        _, page = anon.request("GET", signup, raw=True, auth=False)
        csrf = _csrf(page, anon.cookies)
        status, body = anon.request(
            "POST", signup, raw=True, auth=False,
            body=urllib.parse.urlencode({"csrfmiddlewaretoken": csrf, "email": email,
                                         "password": password, "allow_newsletters": "false"}),
            headers={"Content-Type": "application/x-www-form-urlencoded", "Referer": self.url + signup,
                     "X-CSRFToken": csrf})
        if not any(c.name == "sessionid" for c in anon.cookies):
            raise ApiError("POST", "/user/signup/", status, body.decode(errors="replace")[-600:])
        me = anon.get("/api/current-user/whoami")
        token = anon.get("/api/current-user/token")["token"]
        return {"id": me["id"], "email": me["email"], "active_organization": me["active_organization"],
                "token": token}

    def login(self, email, password):
        """A session (cookies) for email/password; returns a client using it."""
        anon = LabelStudio(self.url, timeout=self.timeout)
        _, page = anon.request("GET", "/user/login/", raw=True, auth=False)
        csrf = _csrf(page, anon.cookies)
        anon.request("POST", "/user/login/", raw=True, auth=False,
                     body=urllib.parse.urlencode({"csrfmiddlewaretoken": csrf, "email": email,
                                                  "password": password}),
                     headers={"Content-Type": "application/x-www-form-urlencoded",
                              "Referer": self.url + "/user/login/"})
        return anon

    # -- annotations ----------------------------------------------------------
    def annotate(self, task_id, result, completed_by=None, was_cancelled=False, lead_time=1.0, **extra):
        body = {"result": result, "was_cancelled": was_cancelled, "lead_time": lead_time, **extra}
        if completed_by is not None:
            body["completed_by"] = completed_by
        return self.request("POST", f"/api/tasks/{task_id}/annotations/", body)

    def skip(self, task_id, completed_by=None):
        """A skipped task: an annotation with was_cancelled=true and no result."""
        return self.annotate(task_id, [], completed_by=completed_by, was_cancelled=True)

    def update_annotation(self, annotation_id, result=None, **fields):
        body = dict(fields)
        if result is not None:
            body["result"] = result
        return self.request("PATCH", f"/api/annotations/{annotation_id}/", body)

    def annotation(self, annotation_id):
        return self.get(f"/api/annotations/{annotation_id}/")

    def delete_annotation(self, annotation_id):
        return self.request("DELETE", f"/api/annotations/{annotation_id}/")

    # -- webhooks -------------------------------------------------------------
    def add_webhook(self, project_id, url, actions=WEBHOOK_ACTIONS, headers=None):
        return self.request("POST", "/api/webhooks/", {
            "project": project_id, "url": url, "send_payload": True,
            "send_for_all_actions": False, "actions": list(actions),
            "headers": headers or {}, "is_active": True})

    def webhooks(self, project_id=None):
        return self.get("/api/webhooks/", **({"project": project_id} if project_id else {}))

    # -- personal access tokens -------------------------------------------
    def create_pat(self):
        """POST /api/token/ -> {"token": <refresh JWT>}; 409 when the user has one already."""
        return self.request("POST", "/api/token/")["token"]

    def access_token(self, refresh):
        return self.request("POST", "/api/token/refresh/", {"refresh": refresh}, auth=False)["access"]


def serve_sink(port, out, status=200, delay=0.0, status_file=None):
    """A webhook receiver for tests: appends each POST as one JSON line
    {"t", "path", "status", "headers", "body"} to `out` and answers `status`
    after `delay` seconds. `status_file`, when it exists, overrides status
    per request (write 503 into it to make Label Studio's delivery fail)."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            code = status
            if status_file and os.path.exists(status_file):
                code = int(open(status_file).read().split()[0])
            if delay:
                time.sleep(delay)
            with open(out, "a") as f:
                f.write(json.dumps({"t": time.time(), "path": self.path, "status": code,
                                    "headers": dict(self.headers),
                                    "body": json.loads(body or b"null")}) + "\n")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def _csrf(page, cookies):
    m = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    if m:
        return m.group(1).decode()
    for c in cookies:
        if c.name == "csrftoken":
            return c.value
    raise RuntimeError("no CSRF token in the form")


def _demo(ls, hook=None):
    t0 = time.monotonic()
    p = ls.create_project(f"jurystream demo {int(time.time())}", maximum_annotations=3)
    if hook:
        ls.add_webhook(p["id"], hook)
    ids = ls.import_tasks(p["id"], sample_tasks(5))
    stamp = int(time.time() * 1000)
    reviewers = [ls.create_reviewer(f"reviewer{i}-{stamp}@jurystream.test") for i in range(3)]
    votes = [("Pass", 0.9, 5), ("Pass", 0.7, 4), ("Flag", 0.2, 2)]
    annotations = []
    for task_id in ids[:3]:
        for r, (v, s, q) in zip(reviewers, votes):
            annotations.append(ls.annotate(task_id, results(v, s, q), completed_by=r["id"])["id"])
    return {"project": p["id"], "tasks": ids, "reviewers": reviewers, "annotations": annotations,
            "seconds": round(time.monotonic() - t0, 2)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default=os.environ.get("LS_URL", "http://127.0.0.1:18080"))
    ap.add_argument("--token", default=os.environ.get("LS_TOKEN"))
    ap.add_argument("--bearer", action="store_true", help="--token is an access token (Bearer)")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def cmd(name, *args):
        p = sub.add_parser(name)
        for a in args:
            flags, kw = a
            p.add_argument(*flags, **kw)
        return p

    vote_args = [(("--verdict",), {}), (("--score",), {"type": float}), (("--quality",), {"type": int}),
                 (("--as-user",), {"type": int, "help": "completed_by user id"})]
    cmd("create-project", (("--title",), {"required": True}), (("--label-config",), {}),
        (("--maximum-annotations",), {"type": int, "default": 1}))
    cmd("import-tasks", (("--project",), {"type": int, "required": True}),
        (("--count",), {"type": int, "default": 5}), (("--start",), {"type": int, "default": 0}),
        (("--file",), {}))
    cmd("create-reviewer", (("--email",), {"required": True}), (("--password",), {"default": "reviewer-password-1"}))
    cmd("create-user", (("--email",), {"required": True}))
    cmd("annotate", (("--task",), {"type": int, "required": True}), *vote_args)
    cmd("update-annotation", (("--annotation",), {"type": int, "required": True}), *vote_args)
    cmd("skip", (("--task",), {"type": int, "required": True}), (("--as-user",), {"type": int}))
    cmd("delete-annotation", (("--annotation",), {"type": int, "required": True}))
    cmd("annotation", (("--annotation",), {"type": int, "required": True}))
    cmd("add-webhook", (("--project",), {"type": int, "required": True}), (("--hook-url", "--url-hook"), {"dest": "hook", "required": True}),
        (("--header",), {"action": "append", "default": []}))
    cmd("task", (("--task",), {"type": int, "required": True}))
    cmd("route", (("--task",), {"type": int, "required": True}), (("--overlap",), {"type": int, "required": True}))
    cmd("next", (("--project",), {"type": int, "required": True}), (("--reviewer-token",), {"required": True}))
    cmd("sync", (("--project",), {"type": int, "required": True}), (("--since",), {}),
        (("--page-size",), {"type": int, "default": 100}))
    cmd("projects")
    cmd("project", (("--project",), {"type": int, "required": True}))
    cmd("pat")
    cmd("access", (("--refresh",), {"required": True}))
    cmd("demo", (("--hook",), {}))
    cmd("sink", (("--port",), {"type": int, "required": True}), (("--out",), {"required": True}),
        (("--status",), {"type": int, "default": 200}), (("--delay",), {"type": float, "default": 0.0}),
        (("--status-file",), {}))
    a = ap.parse_args(argv)

    ls = LabelStudio(a.url, a.token, scheme="Bearer" if a.bearer else "Token")
    c = a.cmd
    if c == "create-project":
        cfg = open(a.label_config).read() if a.label_config else TEST_LABEL_CONFIG
        out = ls.create_project(a.title, cfg, maximum_annotations=a.maximum_annotations)
    elif c == "import-tasks":
        tasks = json.load(open(a.file)) if a.file else sample_tasks(a.count, a.start)
        out = {"task_ids": ls.import_tasks(a.project, tasks)}
    elif c == "create-reviewer":
        out = ls.create_reviewer(a.email, a.password)
    elif c == "create-user":
        out = ls.create_user(a.email)
    elif c == "annotate":
        out = ls.annotate(a.task, results(a.verdict, a.score, a.quality), completed_by=a.as_user)
    elif c == "update-annotation":
        extra = {"completed_by": a.as_user} if a.as_user else {}
        out = ls.update_annotation(a.annotation, results(a.verdict, a.score, a.quality) or None, **extra)
    elif c == "skip":
        out = ls.skip(a.task, completed_by=a.as_user)
    elif c == "delete-annotation":
        out = ls.delete_annotation(a.annotation) or {"deleted": a.annotation}
    elif c == "annotation":
        out = ls.annotation(a.annotation)
    elif c == "add-webhook":
        out = ls.add_webhook(a.project, a.hook, headers=dict(h.split("=", 1) for h in a.header))
    elif c == "task":
        t = ls.task(a.task)
        out = {k: t.get(k) for k in ("id", "project", "overlap", "is_labeled", "total_annotations",
                                      "cancelled_annotations", "updated_at", "data")}
    elif c == "route":
        t = ls.route(a.task, a.overlap)
        out = {k: t.get(k) for k in ("id", "overlap", "is_labeled", "total_annotations", "updated_at")}
    elif c == "next":
        t = LabelStudio(a.url, a.reviewer_token).next_task(a.project)
        out = None if t is None else {"id": t["id"], "data": t["data"], "queue": t.get("queue")}
    elif c == "sync":
        out = ls.sync(a.project, a.since, a.page_size)
    elif c == "projects":
        out = [{"id": p["id"], "title": p["title"]} for p in ls.projects()]
    elif c == "project":
        out = ls.project(a.project)
    elif c == "pat":
        out = {"refresh": ls.create_pat()}
    elif c == "access":
        out = {"access": ls.access_token(a.refresh)}
    elif c == "demo":
        out = _demo(ls, a.hook)
    elif c == "sink":
        serve_sink(a.port, a.out, a.status, a.delay, a.status_file)
        return
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    try:
        main()
    except ApiError as e:
        print(f"ls.py: {e}", file=sys.stderr)
        sys.exit(1)
