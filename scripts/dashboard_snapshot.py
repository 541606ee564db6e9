#!/usr/bin/env python3
"""The Grafana dashboard's queries against a real Prometheus, drawn as one
HTML page (scripts/dashboard-snapshot.sh runs it; python3, stdlib only).

  dashboard_snapshot.py settle --metrics URL --prometheus URL [--quiet 8] [--timeout 180]
      Waits until `jurystream run` (its /metrics at URL) has stopped
      counting (score updates > 0 and unchanged for --quiet seconds, no
      batch waiting at the reputation barrier) and Prometheus reports the
      same counts.

  dashboard_snapshot.py render --prometheus URL --start UNIX --end UNIX
          --scrape-interval S --out PAGE.html [--summary FILE.json] DASHBOARD.json...
      Runs every target of every panel of each dashboard through
      Prometheus' HTTP API (query_range over [start, end], or an instant
      query at end for instant targets), with Grafana's variables
      substituted: $model and $rubric as "All" (.*), $__rate_interval as
      Grafana computes it for a data source scraped every S seconds.
      Writes the panels, laid out on the dashboard's grid, as inline SVG and
      HTML. Prints each panel's outcome and the page's height (for the
      browser window). Exit status 1 when a query returns an error or no
      panel has data.

Only what the dashboard uses is drawn: time series (lines, bars, dashed
overrides, threshold lines), stats (last value, name or both), heatmaps
of Prometheus buckets, and the leaderboard table (merge, organize, sort).
It is not Grafana: colours, axes and legends are approximations.
"""

import argparse
import html
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

# Grafana's classic palette.
PALETTE = [
    "#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1",
    "#BA43A9", "#705DA0", "#508642", "#CCA300", "#447EBC", "#C15C17",
    "#890F02", "#0A437C", "#6D1F62", "#584477", "#B7DBAB", "#F4D598",
]

WIDTH = 1200          # page width, px
COL = WIDTH / 24      # one grid column
ROW = 24              # one grid row unit, px
GAP = 6               # space between panels


# ---------------------------------------------------------------- HTTP

def get_json(url, timeout=10):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        body = e.read().decode("utf-8", "replace")
        try:
            return json.loads(body)
        except ValueError:
            return {"status": "error", "error": f"HTTP {e.code}: {body[:300]}"}


def get_text(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def prom_query(base, expr, at=None):
    q = {"query": expr}
    if at is not None:
        q["time"] = f"{at:.3f}"
    return get_json(f"{base}/api/v1/query?{urllib.parse.urlencode(q)}")


def prom_range(base, expr, start, end, step):
    q = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    return get_json(f"{base}/api/v1/query_range?{urllib.parse.urlencode(q)}", timeout=30)


def prom_scalar(base, expr):
    try:
        d = prom_query(base, expr)
    except OSError:
        return None
    res = d.get("data", {}).get("result", []) if d.get("status") == "success" else []
    if not res:
        return None
    return float(res[0]["value"][1])


# ---------------------------------------------------------------- settle

def exposition_sum(text, name):
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        series, _, value = line.rpartition(" ")
        metric = series.split("{", 1)[0]
        if metric == name:
            total += float(value)
            found = True
    return total if found else None


def settle(args):
    counted = ["jurystream_score_updates_total", "jurystream_votes_accepted_total",
               "jurystream_votes_duplicate_total", "jurystream_votes_rejected_total"]
    deadline = time.time() + args.timeout
    last, since = None, time.time()
    while True:
        try:
            text = get_text(f"{args.metrics}/metrics")
        except OSError as e:
            sys.exit(f"settle: GET {args.metrics}/metrics: {e}")
        now = tuple(exposition_sum(text, n) or 0.0 for n in counted)
        pending = exposition_sum(text, "jurystream_reputation_pending_batches") or 0.0
        if now != last or pending > 0:
            last, since = now, time.time()
        elif now[0] > 0 and time.time() - since >= args.quiet:
            break
        if time.time() > deadline:
            sys.exit(f"settle: run still counting after {args.timeout}s "
                     f"(score updates {now[0]:g}, waiting batches {pending:g})")
        time.sleep(0.5)
    want = dict(zip(counted, last))
    print(f"    run: {want['jurystream_score_updates_total']:g} score updates, "
          f"{want['jurystream_votes_accepted_total']:g} votes accepted, "
          f"{want['jurystream_votes_duplicate_total']:g} duplicates, "
          f"{want['jurystream_votes_rejected_total']:g} rejected")
    while True:
        got = {n: prom_scalar(args.prometheus, f"sum({n})") for n in counted}
        if all(got[n] is not None and abs(got[n] - want[n]) < 1e-9 for n in counted):
            print("    Prometheus has the same counts")
            return
        if time.time() > deadline:
            sys.exit(f"settle: Prometheus has {got}, /metrics {want}")
        time.sleep(0.5)


# ---------------------------------------------------------------- formatting

def fmt_num(v, decimals=None):
    if v is None or math.isnan(v):
        return "–"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if decimals is not None:
        return f"{v:.{decimals}f}"
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1e9:
        return f"{v / 1e9:.3g} G"
    if a >= 1e6:
        return f"{v / 1e6:.3g} M"
    if a >= 1e4:
        return f"{v / 1e3:.3g} K"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.3g}"
    if a >= 0.001:
        return f"{v:.3f}".rstrip("0").rstrip(".")
    return f"{v:.2e}"


def fmt(v, unit, decimals=None):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if unit == "percentunit":
        return f"{v * 100:.{1 if decimals is None else decimals}f} %"
    if unit == "s":
        a = abs(v)
        if a == 0:
            return "0 s"
        if a < 1e-3:
            return f"{v * 1e6:.0f} µs"
        if a < 1:
            return f"{v * 1e3:.3g} ms"
        if a < 120:
            return f"{v:.3g} s"
        if a < 7200:
            return f"{v / 60:.3g} min"
        if a < 172800:
            return f"{v / 3600:.3g} h"
        return f"{v / 86400:.3g} d"
    if unit == "bytes":
        for div, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if abs(v) >= div:
                return f"{v / div:.3g} {name}"
        return f"{v:.0f} B"
    if unit == "reqps":
        return f"{fmt_num(v, decimals)} req/s"
    if unit == "ops":
        return f"{fmt_num(v, decimals)} ops/s"
    return fmt_num(v, decimals)


def esc(s):
    return html.escape(str(s), quote=True)


# ---------------------------------------------------------------- queries

def rate_interval(step, scrape):
    """Grafana's $__rate_interval: max(interval + scrape interval, 4 × scrape interval)."""
    return max(step + scrape, 4 * scrape)


def substitute(expr, rate_iv):
    """Grafana's variables as Grafana puts them into the query (All = .*)."""
    iv = f"{rate_iv:g}s"
    out = (expr.replace("${__rate_interval}", iv).replace("$__rate_interval", iv)
           .replace("${model}", ".*").replace("$model", ".*")
           .replace("${rubric}", ".*").replace("$rubric", ".*"))
    if "$" in out:
        raise ValueError(f"unsubstituted variable in {out}")
    return out


def legend_name(fmt_str, metric, expr):
    if not fmt_str or fmt_str == "__auto":
        labels = {k: v for k, v in metric.items() if k != "__name__"}
        if not labels:
            return metric.get("__name__", expr)
        inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return f"{metric.get('__name__', '')}{{{inner}}}"
    return re.sub(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}",
                  lambda m: metric.get(m.group(1), ""), fmt_str)


def to_float(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return float("nan")


def run_targets(panel, base, start, end, step, rate_iv):
    """[(target, series list or None, error or None)], each series
    {"name", "metric", "points": [(t, v)]}."""
    out = []
    for t in panel.get("targets", []):
        expr = t.get("expr", "")
        try:
            q = substitute(expr, rate_iv)
        except ValueError as e:
            out.append((t, None, str(e), expr))
            continue
        instant = t.get("instant") and not t.get("range")
        try:
            d = prom_query(base, q, at=end) if instant else prom_range(base, q, start, end, step)
        except OSError as e:
            out.append((t, None, f"no answer from Prometheus: {e}", q))
            continue
        if d.get("status") != "success":
            out.append((t, None, f"{d.get('errorType', 'error')}: {d.get('error', d)}", q))
            continue
        series = []
        for r in d["data"]["result"]:
            if "values" in r:
                pts = [(float(ts), to_float(v)) for ts, v in r["values"]]
            else:
                pts = [(float(r["value"][0]), to_float(r["value"][1]))]
            series.append({"name": legend_name(t.get("legendFormat"), r["metric"], q),
                           "metric": r["metric"], "points": pts})
        out.append((t, series, None, q))
    return out


def finite(points):
    return [(t, v) for t, v in points if not (math.isnan(v) or math.isinf(v))]


# ---------------------------------------------------------------- overrides

def overrides_for(panel, name):
    props = {}
    for o in panel.get("fieldConfig", {}).get("overrides", []):
        m = o.get("matcher", {})
        hit = ((m.get("id") == "byName" and m.get("options") == name)
               or (m.get("id") == "byRegexp" and re.fullmatch(m.get("options", ""), name)))
        if hit:
            for p in o.get("properties", []):
                props[p["id"]] = p.get("value")
    return props


# ---------------------------------------------------------------- drawing

def time_ticks(start, end, n=4):
    span = end - start
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600):
        if span / step <= n:
            break
    t = math.ceil(start / step) * step
    ticks = []
    while t <= end:
        ticks.append(t)
        t += step
    return ticks


def nice_ticks(lo, hi, n=3):
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    t = math.floor(lo / step) * step
    ticks = []
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def svg_timeseries(panel, series, start, end, w, h, colors):
    d = panel.get("fieldConfig", {}).get("defaults", {})
    unit, decimals = d.get("unit"), d.get("decimals")
    custom = d.get("custom", {})
    vals = [v for s in series for _, v in finite(s["points"])]
    lo = min(vals) if vals else 0.0
    hi = max(vals) if vals else 1.0
    lo = min(lo, 0.0) if lo >= 0 else lo
    if "min" in d:
        lo = d["min"]
    elif "axisSoftMin" in custom:
        lo = min(lo, custom["axisSoftMin"])
    if "max" in d:
        hi = d["max"]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    ticks = nice_ticks(lo, hi)
    lo, hi = min(lo, ticks[0]), max(hi, ticks[-1])
    left, right, top, bottom = 64, 8, 6, 18
    pw, ph = w - left - right, h - top - bottom

    def X(t):
        return left + (t - start) / max(end - start, 1e-9) * pw

    def Y(v):
        return top + (1 - (v - lo) / (hi - lo)) * ph

    parts = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">']
    for tv in ticks:
        y = Y(tv)
        parts.append(f'<line x1="{left}" x2="{w - right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 4}" y="{y + 3:.1f}" class="ax" text-anchor="end">'
                     f'{esc(fmt(tv, unit, decimals))}</text>')
    for tt in time_ticks(start, end):
        x = X(tt)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" class="grid"/>')
        parts.append(f'<text x="{x:.1f}" y="{h - 4}" class="ax" text-anchor="middle">'
                     f'{time.strftime("%H:%M:%S", time.gmtime(tt))}</text>')
    thr = custom.get("thresholdsStyle", {}).get("mode")
    if thr in ("line", "dashed", "line+area", "dashed+area"):
        for stp in d.get("thresholds", {}).get("steps", []):
            if stp.get("value") is not None and lo <= stp["value"] <= hi:
                y = Y(stp["value"])
                parts.append(f'<line x1="{left}" x2="{w - right}" y1="{y:.1f}" y2="{y:.1f}" '
                             f'stroke="#F2495C" stroke-dasharray="4 3" stroke-width="1"/>')
    y0 = Y(max(lo, min(0.0, hi)))
    for s, color in zip(series, colors):
        ov = overrides_for(panel, s["name"])
        dash = ov.get("custom.lineStyle", custom.get("lineStyle", {})) or {}
        dash_attr = ' stroke-dasharray="6 4"' if dash.get("fill") == "dash" else ""
        fill = ov.get("custom.fillOpacity", custom.get("fillOpacity", 0)) / 100
        draw = ov.get("custom.drawStyle", custom.get("drawStyle", "line"))
        # contiguous runs of finite points (NaN and missing steps are gaps)
        runs, cur, prev_t = [], [], None
        step_guess = None
        pts = s["points"]
        if len(pts) > 1:
            step_guess = min(b[0] - a[0] for a, b in zip(pts, pts[1:]))
        for t, v in pts:
            ok = not (math.isnan(v) or math.isinf(v))
            gap = prev_t is not None and step_guess and t - prev_t > 1.5 * step_guess
            if not ok or gap:
                if cur:
                    runs.append(cur)
                cur = []
            if ok:
                cur.append((t, v))
            prev_t = t
        if cur:
            runs.append(cur)
        for run in runs:
            if draw == "bars":
                bw = max(1.5, pw / max(len(pts), 1) * 0.8)
                for t, v in run:
                    if v:
                        parts.append(f'<rect x="{X(t) - bw / 2:.1f}" y="{min(Y(v), y0):.1f}" '
                                     f'width="{bw:.1f}" height="{abs(y0 - Y(v)):.1f}" fill="{color}"/>')
                continue
            if len(run) == 1:
                t, v = run[0]
                parts.append(f'<circle cx="{X(t):.1f}" cy="{Y(v):.1f}" r="1.8" fill="{color}"/>')
                continue
            path = " ".join(f"{X(t):.1f},{Y(v):.1f}" for t, v in run)
            if fill > 0:
                area = (f"{X(run[0][0]):.1f},{y0:.1f} " + path + f" {X(run[-1][0]):.1f},{y0:.1f}")
                parts.append(f'<polygon points="{area}" fill="{color}" fill-opacity="{fill:.2f}"/>')
            parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" '
                         f'stroke-width="1.3"{dash_attr}/>')
    parts.append("</svg>")
    return "".join(parts)


def legend_html(panel, series, colors):
    d = panel.get("fieldConfig", {}).get("defaults", {})
    unit, decimals = d.get("unit"), d.get("decimals")
    rows = []
    for s, color in zip(series, colors):
        ov = overrides_for(panel, s["name"])
        if (ov.get("custom.hideFrom") or {}).get("legend"):
            continue
        u = ov.get("unit", unit)
        pts = finite(s["points"])
        last = pts[-1][1] if pts else None
        rows.append(f'<div class="li"><span class="sw" style="background:{color}"></span>'
                    f'<span class="ln" title="{esc(s["name"])}">{esc(s["name"])}</span>'
                    f'<span class="lv">{esc(fmt(last, u, decimals))}</span></div>')
    return rows


def heatmap_svg(panel, series, start, end, w, h):
    """Prometheus buckets (format heatmap): cumulative `le` series made into
    per-bucket values, one row per bucket."""
    unit = panel.get("options", {}).get("yAxis", {}).get("unit")

    def le_of(s):
        v = s["metric"].get("le", "+Inf")
        return float("inf") if v in ("+Inf", "Inf") else float(v)

    series = sorted(series, key=le_of)
    times = sorted({t for s in series for t, _ in s["points"]})
    grid = [dict(s["points"]) for s in series]
    cells = []
    for i in range(len(series)):
        row = []
        for t in times:
            v = grid[i].get(t, float("nan"))
            below = grid[i - 1].get(t, 0.0) if i else 0.0
            dv = v - (below if not math.isnan(below) else 0.0)
            row.append(dv if not math.isnan(dv) else None)
        cells.append(row)
    vmax = max([v for r in cells for v in r if v is not None] + [0.0])
    left, right, top, bottom = 64, 8, 6, 18
    pw, ph = w - left - right, h - top - bottom
    n = max(len(series), 1)
    parts = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">']
    if times:
        cw = pw / len(times)
        ch = ph / n
        for i, row in enumerate(cells):
            y = top + ph - (i + 1) * ch
            for j, v in enumerate(row):
                if not v or v <= 0 or vmax <= 0:
                    continue
                a = 0.15 + 0.85 * (v / vmax)
                parts.append(f'<rect x="{left + j * cw:.1f}" y="{y:.1f}" width="{cw + 0.3:.1f}" '
                             f'height="{max(ch - 1, 0.5):.1f}" fill="#FF9830" fill-opacity="{a:.2f}"/>')
        every = max(1, math.ceil(n / max(ph / 22, 1)))
        for i, s in enumerate(series):
            if i % every:
                continue
            y = top + ph - (i + 0.5) * ch
            le = le_of(s)
            label = "+Inf" if math.isinf(le) else fmt(le, unit)
            parts.append(f'<text x="{left - 4}" y="{y + 3:.1f}" class="ax" text-anchor="end">'
                         f'≤ {esc(label)}</text>')
    for tt in time_ticks(start, end):
        x = left + (tt - start) / max(end - start, 1e-9) * pw
        parts.append(f'<text x="{x:.1f}" y="{h - 4}" class="ax" text-anchor="middle">'
                     f'{time.strftime("%H:%M:%S", time.gmtime(tt))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def stat_html(panel, results, w, h):
    d = panel.get("fieldConfig", {}).get("defaults", {})
    unit, decimals = d.get("unit"), d.get("decimals")
    mode = panel.get("options", {}).get("textMode", "auto")
    graph = panel.get("options", {}).get("graphMode", "none")
    items = []
    for _, series, _, _ in results:
        for s in series or []:
            pts = finite(s["points"])
            if not pts:
                continue
            items.append((s["name"], pts[-1][1], pts))
    if not items:
        return None
    cells = []
    for name, v, pts in items:
        spark = ""
        if graph == "area" and len(pts) > 1:
            lo = min(p[1] for p in pts)
            hi = max(p[1] for p in pts)
            hi = hi if hi > lo else lo + 1
            t0, t1 = pts[0][0], pts[-1][0]
            sw, sh = max(w / len(items) - 10, 20), h * 0.35
            xy = " ".join(f"{(t - t0) / max(t1 - t0, 1e-9) * sw:.1f},{sh - (p - lo) / (hi - lo) * sh:.1f}"
                          for t, p in pts)
            spark = (f'<svg class="spark" width="{sw:.0f}" height="{sh:.0f}">'
                     f'<polygon points="0,{sh:.1f} {xy} {sw:.1f},{sh:.1f}" fill="#73BF69" fill-opacity="0.18"/>'
                     f'<polyline points="{xy}" fill="none" stroke="#73BF69" stroke-width="1"/></svg>')
        value = esc(fmt(v, unit, decimals))
        if mode == "name":
            text = f'<div class="sv">{esc(name)}</div>'
        elif mode == "value_and_name" or len(items) > 1:
            text = f'<div class="sn">{esc(name)}</div><div class="sv">{value}</div>'
        else:
            text = f'<div class="sv">{value}</div>'
        cells.append(f'<div class="stat">{spark}{text}</div>')
    return f'<div class="stats">{"".join(cells)}</div>'


def table_html(panel, results):
    """The leaderboard table: instant results merged by their labels, then
    Grafana's organize (order, rename, hide) and sortBy transformations."""
    rows, labels = {}, []
    for t, series, _, _ in results:
        col = f"Value #{t.get('refId', '?')}"
        for s in series or []:
            key = tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__"))
            for k, _ in key:
                if k not in labels:
                    labels.append(k)
            pts = s["points"]
            rows.setdefault(key, {})[col] = pts[-1][1] if pts else None
    if not rows:
        return None
    cols = labels + sorted({c for r in rows.values() for c in r})
    org = next((x["options"] for x in panel.get("transformations", []) if x["id"] == "organize"), {})
    index = org.get("indexByName", {})
    cols = sorted((c for c in cols if not org.get("excludeByName", {}).get(c)),
                  key=lambda c: index.get(c, 1000))
    rename = org.get("renameByName", {})
    names = [rename.get(c, c) for c in cols]
    table = []
    for key, vals in rows.items():
        lab = dict(key)
        table.append([lab.get(c, vals.get(c)) for c in cols])
    sort = next((x["options"].get("sort", []) for x in panel.get("transformations", [])
                 if x["id"] == "sortBy"), [])
    for srt in reversed(sort):
        if srt.get("field") in names:
            i = names.index(srt["field"])
            table.sort(key=lambda r: (r[i] is None, -(r[i] or 0) if srt.get("desc") else (r[i] or 0)))
    head = "".join(f"<th>{esc(n)}</th>" for n in names)
    body = []
    for r in table:
        tds = []
        for c, n, v in zip(cols, names, r):
            if isinstance(v, str):
                tds.append(f"<td>{esc(v)}</td>")
                continue
            ov = overrides_for(panel, n)
            text = fmt(v, ov.get("unit"), ov.get("decimals"))
            if (ov.get("custom.cellOptions") or {}).get("type") == "gauge" and v is not None:
                lo, hi = ov.get("min", 0), ov.get("max", 1)
                frac = min(max((v - lo) / ((hi - lo) or 1), 0), 1)
                tds.append(f'<td class="num"><div class="gauge"><div style="width:{frac * 100:.1f}%">'
                           f'</div></div>{esc(text)}</td>')
            else:
                tds.append(f'<td class="num">{esc(text)}</td>')
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f'<table class="tbl"><tr>{head}</tr>{"".join(body)}</table>'


# ---------------------------------------------------------------- page

CSS = """
* { box-sizing: border-box; }
html, body { margin: 0; background: #111217; color: #d8d9e0; overflow: hidden;
  font: 12px/1.3 "DejaVu Sans", "Liberation Sans", Arial, sans-serif; }
.head { position: absolute; left: 0; top: 0; width: %(W)dpx; height: %(H)dpx; padding: 8px 10px;
  background: #181b1f; border-bottom: 1px solid #2c3235; }
.head h1 { margin: 0 0 3px; font-size: 16px; color: #d8d9e0; }
.head p { margin: 0; font-size: 11.5px; color: #9fa0ab; }
.panel { position: absolute; background: #181b1f; border: 1px solid #2c3235; border-radius: 2px;
  overflow: hidden; }
.panel .t { height: 22px; padding: 4px 8px 0; font-weight: bold; font-size: 12px; color: #d8d9e0;
  white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.row { position: absolute; font-size: 14px; font-weight: bold; color: #d8d9e0; padding-top: 5px;
  border-bottom: 1px solid #2c3235; }
.nodata { position: absolute; left: 0; right: 0; top: 45%%; text-align: center; color: #9fa0ab;
  font-size: 13px; }
.err { margin: 6px 8px; color: #ff7383; font-size: 11px; }
.grid { stroke: #2c3235; stroke-width: 1; shape-rendering: crispEdges; }
svg rect, svg polygon, svg polyline { shape-rendering: crispEdges; }
.ax { fill: #9fa0ab; font-size: 9.5px; }
.legend { display: grid; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr));
  column-gap: 10px; padding: 0 8px; font-size: 10.5px; }
.li { display: flex; align-items: center; white-space: nowrap; height: 14px; }
.sw { width: 10px; height: 3px; margin-right: 5px; flex: none; }
.ln { flex: 1; overflow: hidden; text-overflow: ellipsis; }
.lv { margin-left: 6px; color: #d8d9e0; }
.more { padding: 0 8px; font-size: 10px; color: #9fa0ab; }
.stats { display: flex; height: calc(100%% - 22px); }
.stat { flex: 1; position: relative; text-align: center; display: flex; flex-direction: column;
  justify-content: center; }
.stat .spark { position: absolute; bottom: 2px; left: 5px; }
.stat .sv { position: relative; font-size: 24px; color: #73BF69; font-weight: bold; }
.stat .sn { position: relative; font-size: 11px; color: #9fa0ab; }
.tbl { border-collapse: collapse; width: 100%%; font-size: 10.5px; }
.tbl th { text-align: left; color: #6e9fff; font-weight: normal; padding: 3px 4px;
  border-bottom: 1px solid #2c3235; white-space: nowrap; }
.tbl td { padding: 2px 4px; border-bottom: 1px solid #22252b; white-space: nowrap; }
.tbl td.num { text-align: right; }
.gauge { display: inline-block; width: 36px; height: 8px; background: #22252b; margin-right: 6px;
  vertical-align: middle; }
.gauge div { height: 100%%; background: #73BF69; }
"""


def render_panel(panel, results, start, end, x, y, w, h):
    """HTML of one panel; and whether it has data."""
    title = panel.get("title", "")
    inner_h = h - 22
    errors = [(t, e) for t, _, e, _ in results if e]
    all_series = [s for _, series, _, _ in results for s in series or []]
    has_data = any(finite(s["points"]) for s in all_series)
    body = ""
    if errors:
        body = "".join(f'<div class="err">[{esc(t.get("refId", "?"))}] {esc(e)}</div>'
                       for t, e in errors)
    kind = panel.get("type")
    if has_data and not errors:
        if kind == "stat":
            body = stat_html(panel, results, w, inner_h) or ""
        elif kind == "table":
            body = table_html(panel, results) or ""
        elif kind == "heatmap":
            body = heatmap_svg(panel, all_series, start, end, w - 2, inner_h - 4)
        else:
            shown = [s for s in all_series if finite(s["points"])]
            colors = [PALETTE[i % len(PALETTE)] for i in range(len(shown))]
            rows = legend_html(panel, shown, colors)
            per_line = max(1, int((w - 16) // 200))
            lines = math.ceil(len(rows) / per_line)
            max_lines = max(1, int((inner_h * 0.22) // 14))
            more = ""
            if lines > max_lines:
                keep = max_lines * per_line - 1
                more = f'<div class="more">+ {len(rows) - keep} more series</div>'
                rows = rows[:keep]
                lines = max_lines
            leg_h = lines * 14 + (12 if more else 0) + 10
            chart = svg_timeseries(panel, shown, start, end, w - 2, inner_h - leg_h, colors)
            body = chart + f'<div class="legend">{"".join(rows)}</div>' + more
    elif not errors:
        body = '<div class="nodata">No data</div>'
    return (f'<div class="panel" style="left:{x}px;top:{y}px;width:{w}px;height:{h}px">'
            f'<div class="t" title="{esc(title)}">{esc(title)}</div>{body}</div>'), has_data


def render(args):
    span = args.end - args.start
    step = max(args.scrape_interval, math.ceil(span / 300))
    rate_iv = rate_interval(step, args.scrape_interval)
    header_h = 58
    html_parts, summary = [], []
    errors = 0
    with_data = 0
    y_offset = header_h + GAP
    for path in args.dashboards:
        with open(path, encoding="utf-8") as f:
            dash = json.load(f)
        bottom = 0
        for p in dash.get("panels", []):
            g = p.get("gridPos", {})
            x = round(g.get("x", 0) * COL) + GAP // 2
            y = y_offset + g.get("y", 0) * ROW
            w = round(g.get("w", 24) * COL) - GAP
            h = g.get("h", 8) * ROW - GAP
            bottom = max(bottom, y + h + GAP)
            if p.get("type") == "row":
                html_parts.append(f'<div class="row" style="left:{x}px;top:{y}px;width:{w}px;'
                                  f'height:{h}px">{esc(p.get("title", ""))}</div>')
                continue
            results = run_targets(p, args.prometheus, args.start, args.end, step, rate_iv)
            part, has_data = render_panel(p, results, args.start, args.end, x, y, w, h)
            html_parts.append(part)
            with_data += has_data
            targets = []
            for t, series, err, q in results:
                n = sum(1 for s in series or [] if finite(s["points"]))
                targets.append({"refId": t.get("refId"), "query": q, "series": n, "error": err})
                errors += err is not None
            summary.append({"dashboard": dash.get("title", path), "panel": p.get("title"),
                            "type": p.get("type"), "has_data": has_data, "targets": targets})
        y_offset = bottom
    page_h = y_offset + GAP
    names = ", ".join(esc(p) for p in args.dashboards)
    t0 = time.strftime("%H:%M:%S", time.gmtime(args.start))
    t1 = time.strftime("%H:%M:%S", time.gmtime(args.end))
    head = (f'<div class="head"><h1>jurystream dashboard — its panels\' PromQL on a real Prometheus '
            f'(not Grafana)</h1><p>{names}: every target run through Prometheus\' HTTP API over '
            f'{t0}–{t1} UTC ({span:.0f} s, step {step:g} s), model = rubric = All, '
            f'$__rate_interval = {rate_iv:g}s (scraped every {args.scrape_interval:g} s). '
            f'Drawn as SVG by scripts/dashboard_snapshot.py; Grafana draws the same queries '
            f'with its own styling.</p></div>')
    doc = ("<!doctype html><html><head><meta charset='utf-8'><title>jurystream dashboard snapshot"
           f"</title><style>{CSS % {'W': WIDTH, 'H': header_h}}</style></head>"
           f"<body style='width:{WIDTH}px;height:{page_h}px'>{head}{''.join(html_parts)}</body></html>")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(doc)
    if args.summary:
        with open(args.summary, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    for s in summary:
        state = "error" if any(t["error"] for t in s["targets"]) else (
            "data" if s["has_data"] else "no data")
        print(f"    {state:7}  {s['panel']}")
        for t in s["targets"]:
            if t["error"]:
                print(f"             [{t['refId']}] {t['error']}\n               {t['query']}")
            elif not t["series"] and not s["has_data"]:
                print(f"             [{t['refId']}] {t['query']}")
    print(f"    {with_data} of {len(summary)} panels with data, {errors} query errors")
    print(f"height {page_h}")
    if errors:
        print("render: a panel query returned an error", file=sys.stderr)
        return 1
    if not with_data:
        print("render: no panel has data", file=sys.stderr)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("settle")
    s.add_argument("--metrics", required=True)
    s.add_argument("--prometheus", required=True)
    s.add_argument("--quiet", type=float, default=8)
    s.add_argument("--timeout", type=float, default=180)
    r = sub.add_parser("render")
    r.add_argument("--prometheus", required=True)
    r.add_argument("--start", type=float, required=True)
    r.add_argument("--end", type=float, required=True)
    r.add_argument("--scrape-interval", type=float, default=1)
    r.add_argument("--out", required=True)
    r.add_argument("--summary")
    r.add_argument("dashboards", nargs="+")
    args = ap.parse_args()
    if args.cmd == "settle":
        settle(args)
        return 0
    return render(args)


if __name__ == "__main__":
    sys.exit(main())
