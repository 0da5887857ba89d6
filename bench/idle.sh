#!/usr/bin/env bash
# bench/idle.sh: what a cluster's VMs cost this host when nothing happens in the cluster.
#
#   bench/idle.sh [stacked|external] [IMAGE_DIR]     (make bench-idle SHAPE=…)
#
# Boots a cluster with kiln cluster up under TCG from IMAGE_DIR (default out: the images make
# bake writes, or make e2e's) — stacked: one control plane (2 vCPUs) and a worker; external:
# three etcd nodes (1 vCPU), one control plane and a worker — and prints power-on to every node
# Ready, then, once SETTLE (default 13m) has passed since power-on, over WINDOW (default 120 s):
#   - each QEMU's host CPU (cores: CPU seconds per second) and resident memory;
#   - each container's and kubelet's CPU on the Kubernetes nodes, from kubelet's stats summary
#     (the guest's own clock: under TCG its seconds are not the host's, so these are shares);
#   - kube-system container restarts (kiln cluster status).
# The cluster is removed at the end (its state directory is kept when the run fails).
set -euo pipefail
cd "$(dirname "$0")/.."
shape=${1:-stacked}
images=${2:-out}
settle=${SETTLE:-13m}
window=${WINDOW:-120}
KILN=$PWD/bin/kiln
KUBECTL=${KUBECTL:-${KILN_E2E_CACHE:-$HOME/.cache/kiln/e2e}/bin/kubectl}
state=$(mktemp -d /var/tmp/kiln-idle.XXXXXX)
trap 'echo "bench-idle: failed at line $LINENO (cluster state in $state; kiln cluster down --state-dir $state removes it)" >&2' ERR

case $shape in
stacked) args=(--control-planes 1 --workers 1) ;;
external) args=(--etcd-nodes 3 --control-planes 1 --workers 1) ;;
*) echo "bench-idle: shape $shape: want stacked or external" >&2; exit 2 ;;
esac
[ -x "$KUBECTL" ] || { echo "bench-idle: no kubectl at $KUBECTL (make local-sources builds it)" >&2; exit 2; }

rmdir "$state"
start=$(date +%s)
$KILN cluster up --name idle --state-dir "$state" --image-dir "$images" --accel tcg "${args[@]}" --timeout 60m > "$state.up.log"
ready=$(( $(date +%s) - start ))
printf 'bench-idle: %s: power-on to every node Ready: %dm%02ds\n' "$shape" $((ready / 60)) $((ready % 60))

secs=$(( ${settle%m} * 60 ))
left=$(( start + secs - $(date +%s) ))
[ "$left" -gt 0 ] && sleep "$left"

port=$(grep -o '"apiPort": [0-9]*' "$state/cluster.json" | head -1 | grep -o '[0-9]*$')
kubectl() { "$KUBECTL" --kubeconfig "$state/admin.conf" --server "https://127.0.0.1:$port" --request-timeout 30s "$@"; }
nodes=$(kubectl get nodes -o jsonpath='{.items[*].metadata.name}')

# The QEMU processes: pid and node, from kiln cluster status.
status() { $KILN cluster status --state-dir "$state" -o json; }
status > "$state.status1.json"
for n in $nodes; do kubectl get --raw "/api/v1/nodes/$n/proxy/stats/summary" > "$state.$n.1.json"; done
sleep "$window"
status > "$state.status2.json"
for n in $nodes; do kubectl get --raw "/api/v1/nodes/$n/proxy/stats/summary" > "$state.$n.2.json"; done

python3 - "$state" "$window" $nodes <<'PY'
import json, sys
from datetime import datetime
state, window, nodes = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
a = {n["name"]: n for n in json.load(open(state + ".status1.json"))["nodes"]}
b = {n["name"]: n for n in json.load(open(state + ".status2.json"))["nodes"]}
total = 0.0
print("VM (host)                 CPU cores  RSS MiB  restarts")
for name, n in b.items():
    cores = (n.get("cpuSeconds", 0) - a[name].get("cpuSeconds", 0)) / window
    total += cores
    r = n.get("restarts") or {}
    print("  %-24s %8.2f  %7d  %s" % (name, cores, n.get("rssMiB", 0), r.get("count", "-")))
print("  %-24s %8.2f" % ("all VMs", total))
def cpu(d):
    out = {"(node)": d["node"]["cpu"]["usageCoreNanoSeconds"]}
    for s in d["node"].get("systemContainers", []):
        out[s["name"]] = s["cpu"]["usageCoreNanoSeconds"]
    for p in d["pods"]:
        for c in p["containers"]:
            out[p["podRef"]["name"] + "/" + c["name"]] = c["cpu"]["usageCoreNanoSeconds"]
    return out
t = lambda d: datetime.fromisoformat(d["node"]["cpu"]["time"].replace("Z", "+00:00"))
for n in nodes:
    d1, d2 = json.load(open("%s.%s.1.json" % (state, n))), json.load(open("%s.%s.2.json" % (state, n)))
    c1, c2 = cpu(d1), cpu(d2)
    sec = (t(d2) - t(d1)).total_seconds()
    print("%s (guest clock, %.0f s)" % (n, sec))
    for k in sorted(c2, key=lambda k: -(c2[k] - c1.get(k, c2[k]))):
        if k in c1 and c2[k] > c1[k]:
            print("  %-56s %.3f" % (k, (c2[k] - c1[k]) / 1e9 / sec))
PY
$KILN cluster down --state-dir "$state" > /dev/null
rm -f "$state".*
trap - ERR
