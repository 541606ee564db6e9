#!/usr/bin/env bash
# Validates everything under deploy/ offline:
#   - Prometheus: promtool check rules / test rules (every alert) / check config
#   - every YAML and JSON file parses
#   - Kubernetes manifests against the Kubernetes OpenAPI schemas bundled in
#     the kubernetes-validate package (strict: unknown fields are errors), for
#     the oldest and newest Kubernetes versions it bundles that we support;
#     the PodMonitor (a CRD, not bundled) gets a structural check
#   - the manifests agree with each other (selectors, ports, probes, state.dir,
#     metrics.listen, grace period above kafka.shutdown_timeout_ms), also
#     those of `jurystream connect` (connect-*.yaml: two Deployments, their
#     Services, Secret, PodMonitor, and the same Kafka settings as the
#     processor)
#   - docker-compose.yml against the Compose Specification schema bundled in
#     check-jsonschema (vendor.compose-spec), and the files it mounts exist;
#     its two connect instances behind haproxy (`haproxy -c` on its
#     haproxy.cfg: Debian's haproxy, scripts/install-deps.sh)
#   - the Grafana dashboard: every panel has targets with an expr, every
#     datasource is ${datasource}, the model/rubric variables are there
#   - the jurystream config files load in jurystream itself (when built; the
#     connect ones when that binary has the connect command)
#
# The validators are installed once (pinned) into a virtualenv under
# $HOME/.cache; after that no network is used.
#   scripts/validate-deploy.sh
# Env: JURYSTREAM_VALIDATE_VENV (venv path), JURYSTREAM_BIN (binary to load
# the config files with; default target/debug/jurystream when present).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

VENV="${JURYSTREAM_VALIDATE_VENV:-$HOME/.cache/jurystream-validate-venv}"
REQS="kubernetes-validate==1.37.0 check-jsonschema==0.39.0 PyYAML==6.0.3"
K8S_VERSIONS="1.29.0 1.37.0"

step() { printf '\n== %s\n' "$*"; }
fail() { echo "validate-deploy: FAILED: $*" >&2; exit 1; }

# ---------------------------------------------------------------- tools
step "validators ($VENV)"
if [ ! -f "$VENV/.reqs" ] || [ "$(cat "$VENV/.reqs")" != "$REQS" ]; then
    echo "installing $REQS"
    rm -rf "$VENV"
    python3 -m venv "$VENV" || fail "python3 -m venv (Debian: apt-get install python3-venv)"
    # shellcheck disable=SC2086
    "$VENV/bin/pip" install --quiet --disable-pip-version-check $REQS
    echo "$REQS" > "$VENV/.reqs"
else
    echo "already installed: $REQS"
fi
PY="$VENV/bin/python"
command -v promtool >/dev/null 2>&1 || fail "promtool not found (scripts/install-deps.sh installs Debian's prometheus)"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# ---------------------------------------------------------------- prometheus
step "promtool check rules"
promtool check rules deploy/prometheus/alerts.yml
step "promtool test rules"
promtool test rules deploy/prometheus/alerts_test.yml
step "promtool check config (rule_files pointed at the repository copy)"
sed "s#/etc/prometheus/alerts.yml#$ROOT/deploy/prometheus/alerts.yml#" \
    deploy/prometheus/prometheus.yml > "$TMP/prometheus.yml"
promtool check config "$TMP/prometheus.yml"

# ---------------------------------------------------------------- k8s schemas
step "Kubernetes schemas (kubernetes-validate --strict)"
k8s_files=()
for f in deploy/k8s/*.yaml; do
    case "$(basename "$f")" in
        kustomization.yaml | podmonitor.yaml | connect-podmonitor.yaml) ;; # not built-in kinds: checked below
        *) k8s_files+=("$f") ;;
    esac
done
for v in $K8S_VERSIONS; do
    "$VENV/bin/kubernetes-validate" --strict --kubernetes-version "$v" "${k8s_files[@]}"
done

# ---------------------------------------------------------------- compose schema
step "Compose Specification schema (check-jsonschema vendor.compose-spec)"
"$VENV/bin/check-jsonschema" --builtin-schema vendor.compose-spec deploy/compose/docker-compose.yml
step "haproxy -c (the compose stack's balancer in front of connect)"
haproxy -c -f deploy/compose/haproxy.cfg

# ---------------------------------------------------------------- the rest
step "parse, cross-checks, dashboard"
"$PY" - "$ROOT" "$TMP" <<'PYEOF'
import json, os, re, sys, tomllib
import yaml

root, tmp = sys.argv[1], sys.argv[2]
deploy = os.path.join(root, "deploy")
errors = []

def err(msg):
    errors.append(msg)
    print("ERROR", msg)

def rel(p):
    return os.path.relpath(p, root)

# Every YAML and JSON file parses.
docs = {}
for d, _, files in os.walk(deploy):
    for name in sorted(files):
        p = os.path.join(d, name)
        try:
            if name.endswith((".yml", ".yaml")):
                with open(p) as f:
                    docs[rel(p)] = [x for x in yaml.safe_load_all(f) if x is not None]
            elif name.endswith(".json"):
                with open(p) as f:
                    docs[rel(p)] = [json.load(f)]
            elif name.endswith(".toml"):
                with open(p, "rb") as f:
                    docs[rel(p)] = [tomllib.load(f)]
            else:
                continue
            print("parsed", rel(p))
        except Exception as e:  # noqa: BLE001
            err(f"{rel(p)}: does not parse: {e}")

def one(path, kind):
    for x in docs.get(path, []):
        if x.get("kind") == kind:
            return x
    err(f"{path}: no {kind}")
    return {}

# ---- Kubernetes: the manifests agree with each other.
k = "deploy/k8s/"
sts = one(k + "statefulset.yaml", "StatefulSet")
svc = one(k + "service.yaml", "Service")
cm = one(k + "configmap.yaml", "ConfigMap")
pm = one(k + "podmonitor.yaml", "PodMonitor")
pdb = one(k + "poddisruptionbudget.yaml", "PodDisruptionBudget")
kust = docs.get(k + "kustomization.yaml", [{}])[0]
for f in sorted(os.listdir(os.path.join(deploy, "k8s"))):
    if f != "kustomization.yaml" and f not in kust.get("resources", []):
        err(f"{k}kustomization.yaml does not list {f}")

spec = sts.get("spec", {})
tmpl = spec.get("template", {})
pod_labels = tmpl.get("metadata", {}).get("labels", {})
pod = tmpl.get("spec", {})
sel = spec.get("selector", {}).get("matchLabels", {})

def matches(selector):
    return bool(selector) and all(pod_labels.get(a) == b for a, b in selector.items())

if not matches(sel):
    err("StatefulSet selector does not match its pod labels")
if spec.get("serviceName") != svc.get("metadata", {}).get("name"):
    err("StatefulSet serviceName is not the Service's name")
if svc.get("spec", {}).get("clusterIP") != "None":
    err("Service is not headless (clusterIP: None)")
if not matches(svc.get("spec", {}).get("selector", {})):
    err("Service selector does not match the pod labels")
if not matches(pdb.get("spec", {}).get("selector", {}).get("matchLabels", {})):
    err("PodDisruptionBudget selector does not match the pod labels")

containers = pod.get("containers", [])
c = containers[0] if containers else {}
ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
if ports.get("metrics") != 9464:
    err("container port 'metrics' is not 9464")
for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
    g = c.get(probe, {}).get("httpGet", {})
    if g.get("path") != path or g.get("port") not in ("metrics", 9464):
        err(f"{probe} is not GET {path} on the metrics port")
for r in ("requests", "limits"):
    res = c.get("resources", {}).get(r, {})
    if not res.get("cpu") or not res.get("memory"):
        err(f"container resources.{r} must set cpu and memory")
env = {e["name"]: e for e in c.get("env", [])}
iid = env.get("JURYSTREAM_INSTANCE_ID", {})
if iid.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "metadata.name":
    err("JURYSTREAM_INSTANCE_ID must come from metadata.name")
if (pod.get("securityContext", {}).get("runAsNonRoot") is not True):
    err("pod securityContext.runAsNonRoot must be true")

try:
    conf = tomllib.loads(cm.get("data", {}).get("config.toml", ""))
except Exception as e:  # noqa: BLE001
    err(f"ConfigMap config.toml does not parse: {e}")
    conf = {}
with open(os.path.join(tmp, "k8s-config.toml"), "w") as f:
    f.write(cm.get("data", {}).get("config.toml", ""))
if conf.get("metrics", {}).get("listen") != "0.0.0.0:9464":
    err("ConfigMap: metrics.listen must be 0.0.0.0:9464 in a pod")
shutdown_ms = conf.get("kafka", {}).get("shutdown_timeout_ms", 10000)
grace = pod.get("terminationGracePeriodSeconds", 30)
if not grace * 1000 > shutdown_ms:
    err(f"terminationGracePeriodSeconds {grace} must exceed kafka.shutdown_timeout_ms {shutdown_ms}")
mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
claims = [t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])]
state_dir = conf.get("state", {}).get("dir")
if not any(mounts.get(n) == state_dir for n in claims):
    err(f"state.dir {state_dir!r} is not the mount path of a volumeClaimTemplate")
args = c.get("args", [])
cfg_path = args[args.index("--config") + 1] if "--config" in args else None
cm_mounts = {v["name"] for v in pod.get("volumes", [])
             if v.get("configMap", {}).get("name") == cm.get("metadata", {}).get("name")}
if not cfg_path or not any(os.path.dirname(cfg_path) == mounts.get(n) for n in cm_mounts):
    err("--config does not point into the mounted ConfigMap")

# PodMonitor (CRD monitoring.coreos.com/v1): structure by hand.
if pm.get("apiVersion") != "monitoring.coreos.com/v1":
    err("PodMonitor apiVersion must be monitoring.coreos.com/v1")
pms = pm.get("spec", {})
if not matches(pms.get("selector", {}).get("matchLabels", {})):
    err("PodMonitor selector does not match the pod labels")
eps = pms.get("podMetricsEndpoints", [])
if not eps or any(e.get("port") not in ports or e.get("path", "/metrics") != "/metrics" for e in eps):
    err("PodMonitor podMetricsEndpoints must scrape /metrics on a named container port")
if pod_labels.get(pms.get("jobLabel")) != "jurystream":
    err("PodMonitor jobLabel must name a pod label whose value is 'jurystream' (alerts use job=\"jurystream\")")
allowed = {"jobLabel", "selector", "podMetricsEndpoints", "namespaceSelector", "podTargetLabels", "sampleLimit"}
for key in pms:
    if key not in allowed:
        err(f"PodMonitor spec.{key}: not expected")

# ---- jurystream connect (contract §12): connect-*.yaml.
def docs_of(path, kind):
    out = [x for x in docs.get(path, []) if x.get("kind") == kind]
    if not out:
        err(f"{path}: no {kind}")
    return out

def by_name(items):
    return {x.get("metadata", {}).get("name"): x for x in items}

cdeps = by_name(docs_of(k + "connect-deployment.yaml", "Deployment"))
csvcs = by_name(docs_of(k + "connect-service.yaml", "Service"))
ccm = one(k + "connect-configmap.yaml", "ConfigMap")
cpm = one(k + "connect-podmonitor.yaml", "PodMonitor")
cpdb = one(k + "connect-poddisruptionbudget.yaml", "PodDisruptionBudget")
CONNECT_DEPLOYMENTS = ("jurystream-connect", "jurystream-connect-label-studio")
for name in CONNECT_DEPLOYMENTS:
    if name not in cdeps:
        err(f"connect-deployment.yaml: no Deployment {name}")
    if name not in csvcs:
        err(f"connect-service.yaml: no Service {name}")
try:
    cconf = tomllib.loads(ccm.get("data", {}).get("config.toml", ""))
except Exception as e:  # noqa: BLE001
    err(f"connect ConfigMap config.toml does not parse: {e}")
    cconf = {}
with open(os.path.join(tmp, "k8s-connect-config.toml"), "w") as f:
    f.write(ccm.get("data", {}).get("config.toml", ""))
if cconf.get("connect", {}).get("listen") != "0.0.0.0:9465":
    err("connect ConfigMap: connect.listen must be 0.0.0.0:9465 in a pod")
# connect produces what `run` consumes and routes what it flags.
for section, key, default in (("kafka", "brokers", None), ("kafka", "group_id", None),
                              ("kafka", "input_topics", None), ("outputs", "flags_topic", "jury.flags")):
    a = cconf.get(section, {}).get(key, default)
    b = conf.get(section, {}).get(key, default)
    if key == "input_topics":
        a, b = (a or [None])[:1], (b or [None])[:1]
    if a != b:
        err(f"connect ConfigMap: {section}.{key} {a!r} differs from the processor's {b!r}")
produce_ms = cconf.get("connect", {}).get("produce_timeout_ms", 10000)
pod_sets = {}
for name, dep in cdeps.items():
    dspec = dep.get("spec", {})
    dtmpl = dspec.get("template", {})
    labels = dtmpl.get("metadata", {}).get("labels", {})
    pod_sets[name] = labels
    dpod = dtmpl.get("spec", {})
    dsel = dspec.get("selector", {}).get("matchLabels", {})
    if not dsel or any(labels.get(a) != b for a, b in dsel.items()):
        err(f"Deployment {name}: selector does not match its pod labels")
    if labels.get("app.kubernetes.io/name") != "jurystream-connect":
        err(f"Deployment {name}: pod label app.kubernetes.io/name must be jurystream-connect (job label)")
    if labels.get("app.kubernetes.io/name") == pod_labels.get("app.kubernetes.io/name"):
        err(f"Deployment {name}: its pods would join the processor's Service, PDB and PodMonitor")
    cc = (dpod.get("containers") or [{}])[0]
    cargs = cc.get("args", [])
    if cargs[:1] != ["connect"]:
        err(f"Deployment {name}: args must start with connect")
    cports = {p.get("name"): p.get("containerPort") for p in cc.get("ports", [])}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        g = cc.get(probe, {}).get("httpGet", {})
        port = cports.get(g.get("port"), g.get("port"))
        if g.get("path") != path or port != 9465:
            err(f"Deployment {name}: {probe} is not GET {path} on port 9465")
    for r in ("requests", "limits"):
        res = cc.get("resources", {}).get(r, {})
        if not res.get("cpu") or not res.get("memory"):
            err(f"Deployment {name}: resources.{r} must set cpu and memory")
    if dpod.get("securityContext", {}).get("runAsNonRoot") is not True:
        err(f"Deployment {name}: securityContext.runAsNonRoot must be true")
    if not dpod.get("terminationGracePeriodSeconds", 30) * 1000 > produce_ms:
        err(f"Deployment {name}: terminationGracePeriodSeconds must exceed connect.produce_timeout_ms")
    cmounts = {m["name"]: m["mountPath"] for m in cc.get("volumeMounts", [])}
    cfg = cargs[cargs.index("--config") + 1] if "--config" in cargs else None
    ccm_vols = {v["name"] for v in dpod.get("volumes", [])
                if v.get("configMap", {}).get("name") == ccm.get("metadata", {}).get("name")}
    if not cfg or not any(os.path.dirname(cfg) == cmounts.get(n) for n in ccm_vols):
        err(f"Deployment {name}: --config does not point into the mounted connect ConfigMap")
    cenv = {e["name"]: e for e in cc.get("env", [])}
    for e in cenv.values():
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref and ref.get("name") != "jurystream-connect":
            err(f"Deployment {name}: env {e['name']} reads Secret {ref.get('name')}, not jurystream-connect")
    if "JURYSTREAM_CONNECT__TOKEN" not in cenv:
        err(f"Deployment {name}: no JURYSTREAM_CONNECT__TOKEN")
    sync = cenv.get("JURYSTREAM_LABEL_STUDIO__SYNC_INTERVAL_SECONDS", {}).get(
        "value", str(cconf.get("label_studio", {}).get("sync_interval_seconds", 60)))
    if name == "jurystream-connect":
        # Never the sync, never the routing: those belong to the pods below.
        if sync != "0":
            err("Deployment jurystream-connect: must set JURYSTREAM_LABEL_STUDIO__SYNC_INTERVAL_SECONDS=0")
        if cenv.get("JURYSTREAM_LABEL_STUDIO__EXTRA_REVIEWS", {}).get("value") != "0":
            err("Deployment jurystream-connect: must set JURYSTREAM_LABEL_STUDIO__EXTRA_REVIEWS=0")
        if (dspec.get("replicas") or 1) < 2:
            err("Deployment jurystream-connect: at least 2 replicas")
    if name == "jurystream-connect-label-studio":
        if (dspec.get("replicas") or 1) < 2:
            err("Deployment jurystream-connect-label-studio: at least 2 replicas (Label Studio never retries a webhook)")
        strategy = dspec.get("strategy", {})
        if strategy.get("type") != "RollingUpdate" or strategy.get("rollingUpdate", {}).get("maxUnavailable") != 0:
            err("Deployment jurystream-connect-label-studio: RollingUpdate with maxUnavailable 0 (a webhook pod serves throughout a rollout)")
        if sync == "0":
            err("Deployment jurystream-connect-label-studio: must sync")
        if "JURYSTREAM_LABEL_STUDIO__TOKEN" not in cenv:
            err("Deployment jurystream-connect-label-studio: no JURYSTREAM_LABEL_STUDIO__TOKEN")
# Selectors: each Service reaches its own Deployment's pods and no other.
def sel_matches(selector, labels):
    return bool(selector) and all(labels.get(a) == b for a, b in selector.items())
for name, s in csvcs.items():
    ssel = s.get("spec", {}).get("selector", {})
    hit = [d for d, labels in pod_sets.items() if sel_matches(ssel, labels)]
    if hit != [name]:
        err(f"Service {name}: selects the pods of {hit}, must select exactly those of Deployment {name}")
    sports = s.get("spec", {}).get("ports", [])
    if not any(p.get("port") == 9465 and p.get("targetPort") in ("http", 9465) for p in sports):
        err(f"Service {name}: must expose port 9465 (targetPort http)")
names = list(pod_sets)
for i, a in enumerate(names):
    for b in names[i + 1:]:
        sa = cdeps[a].get("spec", {}).get("selector", {}).get("matchLabels", {})
        if sel_matches(sa, pod_sets[b]):
            err(f"Deployments {a} and {b} have overlapping selectors")
if sorted(d for d, labels in pod_sets.items()
        if sel_matches(cpdb.get("spec", {}).get("selector", {}).get("matchLabels", {}), labels)) != sorted(CONNECT_DEPLOYMENTS):
    err("connect PodDisruptionBudget must select the pods of both connect Deployments")
if cpdb.get("spec", {}).get("maxUnavailable") != 1:
    err("connect PodDisruptionBudget: maxUnavailable 1 (one connect pod down at a time)")
if cpm.get("apiVersion") != "monitoring.coreos.com/v1":
    err("connect PodMonitor apiVersion must be monitoring.coreos.com/v1")
cpms = cpm.get("spec", {})
if sorted(d for d, labels in pod_sets.items()
          if sel_matches(cpms.get("selector", {}).get("matchLabels", {}), labels)) != sorted(CONNECT_DEPLOYMENTS):
    err("connect PodMonitor must select the pods of both connect Deployments")
if any(labels.get(cpms.get("jobLabel")) != "jurystream-connect" for labels in pod_sets.values()):
    err("connect PodMonitor jobLabel must name a pod label whose value is 'jurystream-connect'")
ceps = cpms.get("podMetricsEndpoints", [])
if not ceps or any(e.get("port") != "http" or e.get("path", "/metrics") != "/metrics" for e in ceps):
    err("connect PodMonitor must scrape /metrics on port http")
for key in cpms:
    if key not in allowed:
        err(f"connect PodMonitor spec.{key}: not expected")

# ---- Compose: referenced files exist, config agrees.
cdir = os.path.join(deploy, "compose")
comp = docs.get("deploy/compose/docker-compose.yml", [{}])[0]
services = comp.get("services", {})
for name in ("kafka", "jurystream", "connect-a", "connect-b", "connect-lb", "prometheus", "grafana"):
    if name not in services:
        err(f"compose: no service {name}")
if not str(services.get("kafka", {}).get("image", "")).startswith("apache/kafka:"):
    err("compose: kafka must use the apache/kafka image")
if services.get("kafka", {}).get("environment", {}).get("KAFKA_PROCESS_ROLES") != "broker,controller":
    err("compose: kafka must run KRaft (broker,controller)")
b = services.get("jurystream", {}).get("build", {})
ctx = os.path.normpath(os.path.join(cdir, b.get("context", ".")))
if not os.path.isfile(os.path.join(ctx, b.get("dockerfile", "Dockerfile"))):
    err("compose: jurystream build dockerfile not found")
for sname, s in services.items():
    for v in s.get("volumes", []):
        src = v.split(":")[0]
        if src.startswith((".", "/")):
            p = os.path.normpath(os.path.join(cdir, src))
            if not os.path.exists(p):
                err(f"compose: {sname} mounts missing {src}")
ccfg = docs.get("deploy/compose/config.toml", [{}])[0]
if ccfg.get("metrics", {}).get("listen") != "0.0.0.0:9464":
    err("compose config.toml: metrics.listen must be 0.0.0.0:9464")
stop = services.get("jurystream", {}).get("stop_grace_period", "10s")
m = re.fullmatch(r"(\d+)s", str(stop))
if not m or int(m.group(1)) * 1000 <= ccfg.get("kafka", {}).get("shutdown_timeout_ms", 10000):
    err("compose: jurystream stop_grace_period must exceed kafka.shutdown_timeout_ms")
prom = docs.get("deploy/prometheus/prometheus.yml", [{}])[0]
jobs = {j["job_name"]: j for j in prom.get("scrape_configs", [])}
targets = [t for sc in jobs.get("jurystream", {}).get("static_configs", []) for t in sc.get("targets", [])]
if "jurystream:9464" not in targets:
    err("prometheus.yml: job jurystream must scrape jurystream:9464")
# connect: two instances (its own config file, the same Kafka settings,
# each scraped as jurystream-connect) behind haproxy, which publishes 9465.
connects = [n for n, s in services.items() if s.get("command", [None])[0] == "connect"]
if len(connects) < 2:
    err(f"compose: two connect instances behind the balancer, not {connects}")
for cname in connects:
    conn = services[cname]
    ccmd = conn.get("command", [])
    if ccmd[:2] != ["connect", "--config"] or len(ccmd) < 3:
        err(f"compose: {cname}'s command must be connect --config <file>")
    elif not any(v.startswith("./connect.toml:") and v.split(":")[1] == ccmd[2] for v in conn.get("volumes", [])):
        err(f"compose: {cname}'s --config is not the mounted ./connect.toml")
    if conn.get("image") != services.get("jurystream", {}).get("image"):
        err(f"compose: {cname} must run the image the jurystream service builds")
    if conn.get("ports"):
        err(f"compose: {cname} publishes nothing (connect-lb publishes 9465)")
    if conn.get("depends_on", {}).get("kafka", {}).get("condition") != "service_healthy":
        err(f"compose: {cname} must depend on a healthy kafka")
conn = services.get(connects[0], {}) if connects else {}
lb = services.get("connect-lb", {})
if not str(lb.get("image", "")).startswith("haproxy:"):
    err("compose: connect-lb must run haproxy")
if "9465:9465" not in lb.get("ports", []):
    err("compose: connect-lb must publish 9465")
try:
    with open(os.path.join(cdir, "haproxy.cfg")) as f:
        hcfg = f.read()
except OSError:
    hcfg = ""
    err("compose: haproxy.cfg missing")
if "option httpchk GET /readyz" not in hcfg or "retries 0" not in hcfg:
    err("compose haproxy.cfg: health check on /readyz and no retries")
for cname in connects:
    if not re.search(rf"^\s*server \S+ {re.escape(cname)}:9465 check", hcfg, re.M):
        err(f"compose haproxy.cfg: no checked server for {cname}")
m = re.search(r"inter (\d+)s fall (\d+)", hcfg)
ctoml = docs.get("deploy/compose/connect.toml", [{}])[0]
# The drain outlasts the balancer's detection (check interval x fall).
if not m or int(m.group(1)) * int(m.group(2)) >= ctoml.get("connect", {}).get("drain_seconds", 5):
    err("compose: connect.drain_seconds must exceed haproxy's inter x fall")
if ctoml.get("connect", {}).get("listen") != "0.0.0.0:9465":
    err("compose connect.toml: connect.listen must be 0.0.0.0:9465")
for key in ("brokers", "group_id", "input_topics"):
    if ctoml.get("kafka", {}).get(key) != ccfg.get("kafka", {}).get(key):
        err(f"compose connect.toml: kafka.{key} differs from config.toml's")
if ctoml.get("outputs", {}).get("flags_topic", "jury.flags") != ccfg.get("outputs", {}).get("flags_topic", "jury.flags"):
    err("compose connect.toml: outputs.flags_topic differs from config.toml's")
m = re.fullmatch(r"(\d+)s", str(conn.get("stop_grace_period", "10s")))
if not m or int(m.group(1)) * 1000 <= ctoml.get("connect", {}).get("produce_timeout_ms", 10000):
    err("compose: connect stop_grace_period must exceed connect.produce_timeout_ms")
ctargets = [t for sc in jobs.get("jurystream-connect", {}).get("static_configs", []) for t in sc.get("targets", [])]
if sorted(ctargets) != sorted(f"{c}:9465" for c in connects):
    err("prometheus.yml: job jurystream-connect must scrape every connect instance on 9465")

# ---- Dockerfile.
with open(os.path.join(deploy, "Dockerfile")) as f:
    df = f.read()
for needle, what in ((r"^FROM rust:1\.95-bookworm AS builder", "builder stage rust:1.95-bookworm"),
                     (r"libclang-dev", "libclang-dev in the builder"),
                     (r"^FROM debian:bookworm-slim", "runtime debian:bookworm-slim"),
                     (r"^USER (?!0\b|root\b)\S+", "a non-root USER"),
                     (r'^ENTRYPOINT \["jurystream"\]', "ENTRYPOINT jurystream")):
    if not re.search(needle, df, re.M):
        err(f"Dockerfile: missing {what}")

# ---- Grafana.
g = "deploy/grafana/"
dash = docs.get(g + "dashboards/jurystream.json", [{}])[0]
DS = "${datasource}"
tv = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
if tv.get("datasource", {}).get("type") != "datasource" or tv.get("datasource", {}).get("query") != "prometheus":
    err("dashboard: variable datasource (type datasource, prometheus) missing")
def var_query(v):
    q = v.get("query")
    return q.get("query") if isinstance(q, dict) else q
if var_query(tv.get("model", {})) != "label_values(jurystream_score_updates_total, model_id)":
    err("dashboard: variable model must be label_values(jurystream_score_updates_total, model_id)")
if not re.fullmatch(r"label_values\(jurystream_score_updates_total(\{[^}]*\})?, voter_prompt_id\)",
                    var_query(tv.get("rubric", {})) or ""):
    err("dashboard: variable rubric must be label_values(jurystream_score_updates_total..., voter_prompt_id)")
for name in ("model", "rubric"):
    if tv.get(name, {}).get("datasource", {}).get("uid") != DS:
        err(f"dashboard: variable {name} must use datasource {DS}")
ids, n = set(), 0
for p in dash.get("panels", []):
    if p.get("type") == "row":
        continue
    n += 1
    t = p.get("title", "?")
    if p.get("id") in ids:
        err(f"dashboard: duplicate panel id {p.get('id')}")
    ids.add(p.get("id"))
    if p.get("datasource", {}).get("uid") != DS:
        err(f"dashboard: panel {t!r} datasource is not {DS}")
    if not p.get("targets"):
        err(f"dashboard: panel {t!r} has no targets")
    for tg in p.get("targets", []):
        if not (tg.get("expr") or "").strip():
            err(f"dashboard: panel {t!r} target {tg.get('refId')} has no expr")
        if tg.get("datasource", {}).get("uid") != DS:
            err(f"dashboard: panel {t!r} target {tg.get('refId')} datasource is not {DS}")
    gp = p.get("gridPos", {})
    if not all(isinstance(gp.get(x), int) for x in ("x", "y", "w", "h")) or gp["x"] + gp["w"] > 24:
        err(f"dashboard: panel {t!r} gridPos is invalid")
if n < 10:
    err(f"dashboard: only {n} panels")
dsp = docs.get(g + "provisioning/datasources/prometheus.yml", [{}])[0]
if dsp.get("apiVersion") != 1 or not any(d.get("type") == "prometheus" for d in dsp.get("datasources", [])):
    err("grafana: datasource provisioning must define a prometheus datasource (apiVersion 1)")
dbp = docs.get(g + "provisioning/dashboards/jurystream.yml", [{}])[0]
paths = [pr.get("options", {}).get("path") for pr in dbp.get("providers", []) if pr.get("type") == "file"]
gvols = services.get("grafana", {}).get("volumes", [])
if dbp.get("apiVersion") != 1 or not paths or not any(v.endswith(":" + paths[0]) or (":" + paths[0] + ":") in v for v in gvols):
    err("grafana: the dashboard provider path is not where compose mounts deploy/grafana/dashboards")

if errors:
    print(f"\n{len(errors)} problem(s)")
    sys.exit(1)
print("cross-checks: ok")
PYEOF

# ---------------------------------------------------------------- jurystream
step "config files load in jurystream"
BIN="${JURYSTREAM_BIN:-${CARGO_TARGET_DIR:-target}/debug/jurystream}"
if [ -x "$BIN" ]; then
    : > "$TMP/empty.jsonl"
    cfgs=(deploy/compose/config.toml "$TMP/k8s-config.toml")
    # The connect files set [connect] and [label_studio], keys a jurystream
    # without the connect command (contract §12) does not know.
    if "$BIN" connect --help > /dev/null 2>&1; then
        cfgs+=(deploy/compose/connect.toml "$TMP/k8s-connect-config.toml")
    else
        echo "skipped: deploy/compose/connect.toml, the k8s connect config ($BIN has no connect command)"
    fi
    for cfg in "${cfgs[@]}"; do
        "$BIN" replay --config "$cfg" --input "$TMP/empty.jsonl" > /dev/null \
            || fail "$cfg is rejected by jurystream"
        echo "ok: $cfg"
    done
else
    echo "skipped: no jurystream binary at $BIN (cargo build --bins)"
fi

echo
echo "validate-deploy: all checks passed"
