#!/usr/bin/env python3
"""Load for `jurystream connect`, standard library only.

    python3 scripts/bench_connect.py URL TOKEN FIXTURE [--batches N] [--singles N] [--webhooks N]

1. NDJSON batches of 1000 votes on CONNECTIONS (default 4) keep-alive
   connections: votes/s over the whole run (every answer must be 200 with
   1000 accepted).
2. One-vote requests, one at a time on one connection: latency p50/p99.
3. Label Studio webhooks (FIXTURE: a real ANNOTATION_UPDATED body, a new
   annotation id each time): latency p50/p99.
Prints one JSON object.
"""
import argparse
import http.client
import json
import threading
import time
import urllib.parse


def vote(i):
    return json.dumps({
        "inference_id": f"bench-{i % 50000}",
        "voter_id": f"v{i % 97}",
        "voter_prompt_id": "accuracy",
        "vote": (i % 101) / 100,
        "timestamp": "2024-07-07T%02d:%02d:%02d.%03dZ" % (
            (i // 3600000) % 24, (i // 60000) % 60, (i // 1000) % 60, i % 1000),
        "vote_id": f"bench-{i}",
        "model_id": "m1",
    })


def conn(url):
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=60)


def post(c, path, body, headers):
    c.request("POST", path, body=body, headers=headers)
    r = c.getresponse()
    data = r.read()
    return r.status, data


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("token")
    ap.add_argument("fixture")
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--singles", type=int, default=2000)
    ap.add_argument("--webhooks", type=int, default=1000)
    a = ap.parse_args()
    auth = {"Authorization": f"Bearer {a.token}"}
    out = {}

    # 1. NDJSON batches of 1000.
    bodies = ["\n".join(vote(b * 1000 + k) for k in range(1000)).encode() for b in range(a.batches)]
    errors = []
    lock = threading.Lock()
    next_batch = [0]

    def worker():
        c = conn(a.url)
        h = dict(auth, **{"Content-Type": "application/x-ndjson"})
        while True:
            with lock:
                i = next_batch[0]
                next_batch[0] += 1
            if i >= len(bodies):
                return
            status, data = post(c, "/v1/votes", bodies[i], h)
            if status != 200 or json.loads(data)["accepted"] != 1000:
                errors.append((status, data[:200]))

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(a.connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - start
    out["batch_votes"] = a.batches * 1000
    out["batch_seconds"] = round(secs, 3)
    out["batch_votes_per_second"] = round(a.batches * 1000 / secs)
    out["batch_errors"] = len(errors)

    # 2. One-vote requests.
    c = conn(a.url)
    h = dict(auth, **{"Content-Type": "application/json"})
    lat = []
    for i in range(a.singles):
        body = vote(10_000_000 + i).encode()
        t0 = time.perf_counter()
        status, _ = post(c, "/v1/votes", body, h)
        lat.append((time.perf_counter() - t0) * 1000)
        if status != 200:
            errors.append(status)
    out["single_ms_p50"] = round(pct(lat, 50), 3)
    out["single_ms_p99"] = round(pct(lat, 99), 3)
    out["single_errors"] = len(errors) - out["batch_errors"]

    # 3. Webhooks.
    hook = json.load(open(a.fixture))
    lat = []
    for i in range(a.webhooks):
        hook["annotation"]["id"] = 1_000_000 + i
        hook["annotation"]["updated_at"] = "2026-11-25T22:%02d:%02d.%06dZ" % (i // 3600 % 60, i // 60 % 60, i % 60)
        body = json.dumps(hook).encode()
        t0 = time.perf_counter()
        status, _ = post(c, "/hooks/label-studio", body, h)
        lat.append((time.perf_counter() - t0) * 1000)
        if status != 200:
            errors.append(status)
    out["webhook_ms_p50"] = round(pct(lat, 50), 3)
    out["webhook_ms_p99"] = round(pct(lat, 99), 3)
    out["errors"] = len(errors)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
