#!/usr/bin/env bash
# The README's cluster recipe for where a campaign runs, on loopback: a Ray head with the job
# server, a `coordinator` node (the `collage_coordinator` resource, no runner resource) and one
# CPU measurement node; `ray job submit --entrypoint-resources '{"collage_coordinator": 1}'`
# must run the campaign on the coordinator node and the runner on the measurement node; the
# campaign's `plan_timing_host` then compares the devices (on one machine: the same CPU).
#
#   bash bench/coordinator_loopback.sh [MODEL] [PORT]   (default zoo:mnist, GCS port 6400)
#
# Nodes are `ray start --block` processes this script kills itself (as
# bench/multinode_loopback.sh does): `ray stop` would stop every Ray on the host.
set -euo pipefail
MODEL=${1:-zoo:mnist}
PORT=${2:-6400}
DASH=$((PORT + 2))
BASE=$(mktemp -d /tmp/cf-coord.XXXXXX)
# shellcheck source=bench/loopback_nodes.sh
source "$(dirname "$0")/loopback_nodes.sh"  # RAY_AUTH_MODE=token, PIDS, stop_nodes at exit

ray start --head --block --node-ip-address 127.0.0.1 --port "$PORT" --num-cpus 1 \
    --ray-client-server-port $((PORT + 1)) --include-dashboard=true \
    --dashboard-host 127.0.0.1 --dashboard-port "$DASH" --disable-usage-stats \
    --temp-dir "$BASE/head" >"$BASE/head.log" 2>&1 &
PIDS=("$!" "${PIDS[@]}")
until grep -q "block forever" "$BASE/head.log"; do sleep 1; done
ray start --block --address "127.0.0.1:$PORT" --node-ip-address 127.0.0.1 --num-cpus 1 \
    --resources '{"collage_coordinator": 1}' --disable-usage-stats \
    --temp-dir "$BASE/coord" >"$BASE/coord.log" 2>&1 &
PIDS=("$!" "${PIDS[@]}")
ray start --block --address "127.0.0.1:$PORT" --node-ip-address 127.0.0.1 --num-cpus 1 \
    --resources '{"cpu_slot_0": 1, "cpu_llc_0to0": 1}' --disable-usage-stats \
    --temp-dir "$BASE/w0" >"$BASE/w0.log" 2>&1 &
PIDS=("$!" "${PIDS[@]}")
for n in coord w0; do until grep -q "block forever" "$BASE/$n.log"; do sleep 1; done; done

# each node's id, by the resource it advertises
python3 - "$PORT" >"$BASE/nodes.txt" <<'EOF'
import sys
import ray
ray.init(address=f"127.0.0.1:{sys.argv[1]}", logging_level="ERROR")
for n in ray.nodes():
    if n["Alive"]:
        res = n["Resources"]
        role = ("coordinator" if "collage_coordinator" in res else
                "measurement" if "cpu_slot_0" in res else "head")
        print(role, n["NodeID"])
EOF
cat "$BASE/nodes.txt"

start=$(date +%s)
# --no-wait, then poll: the CLI's log tail can end (websocket closed) while the job runs
ray job submit --address "http://127.0.0.1:$DASH" --no-wait --submission-id "cf-coord-$PORT" \
    --entrypoint-resources '{"collage_coordinator": 1}' -- \
    bash -c "collage-farm tune $MODEL --address auto --no-report --json --out $BASE/out \
>$BASE/summary.json 2>$BASE/tune.log" >"$BASE/job.log" 2>&1
until ray job status --address "http://127.0.0.1:$DASH" "cf-coord-$PORT" 2>/dev/null \
        | grep -qiE "succeeded|failed|stopped"; do sleep 2; done
echo "job wall time: $(( $(date +%s) - start )) s"
ray job status --address "http://127.0.0.1:$DASH" "cf-coord-$PORT" 2>&1 \
    | grep -iE "succeeded|failed|stopped" | tail -n 1
# the job's supervisor actor runs the entrypoint on the node it was placed on
python3 - "$PORT" >"$BASE/driver_node.txt" <<'EOF'
import sys
import ray
from ray.util.state import list_actors
ray.init(address=f"127.0.0.1:{sys.argv[1]}", logging_level="ERROR")
print(*[a.node_id for a in list_actors(filters=[("class_name", "=", "JobSupervisor")],
                                       detail=True)])
EOF
python3 - "$BASE" <<'EOF'
import json, sys
from pathlib import Path
base = Path(sys.argv[1])
lines = (base / "nodes.txt").read_text().splitlines()
roles = {nid: role for role, nid in (ln.split() for ln in lines)}
for nid in (base / "driver_node.txt").read_text().split():
    print("the campaign (job supervisor) ran on:", roles.get(nid, nid))
s = json.loads((base / "summary.json").read_text())
print("runners on:", [next((r for k, r in roles.items() if k.startswith(h["node"])), h["node"])
                      for h in s["slots"]["per_host"]])
pth = s["plan_timing_host"]
print("plan_timing_host:", {t: v["match"] for t, v in pth["targets"].items()},
      "| different:", pth["different"], "| warning:", pth["warning"])
print("written plan:", s["written_plan"],
      "| measured end to end: %.4g ms" % (s["plan_measured_s"] * 1e3))
EOF
echo "logs and plan: $BASE"
