#!/usr/bin/env bash
# The README's one-machine multi-node recipe, run for real: a Ray head and two worker nodes on
# loopback, a campaign through them, then only the nodes this script started are stopped.
#
#   bash bench/multinode_loopback.sh [MODEL] [PORT]     (default zoo:mnist, GCS port 6390)
#
# Each node is a `ray start --block` in the background: it stays in the foreground of its own
# process and, on SIGTERM, drains and stops every process of that node (its raylet, agents and
# workers; on the head also the GCS). So killing those three PIDs stops exactly these nodes;
# `ray stop` would stop every Ray on the host, other users' included. The head takes no
# measurement slot; worker i advertises core i as a CPU slot and its own LLC domain, so the
# farm puts one runner on each worker (on one machine they still share its cache: fine for
# trying the recipe, not for timings that must match a real cluster's).
set -euo pipefail
MODEL=${1:-zoo:mnist}
PORT=${2:-6390}
BASE=$(mktemp -d /tmp/cf-loopback.XXXXXX)
# shellcheck source=bench/loopback_nodes.sh
source "$(dirname "$0")/loopback_nodes.sh"  # RAY_AUTH_MODE=token, PIDS, stop_nodes at exit

ray start --head --block --node-ip-address 127.0.0.1 --port "$PORT" --num-cpus 1 \
    --ray-client-server-port $((PORT + 1)) --include-dashboard=false --disable-usage-stats \
    --temp-dir "$BASE/head" >"$BASE/head.log" 2>&1 &
PIDS=("$!" "${PIDS[@]}")  # the head is stopped last
until grep -q "block forever" "$BASE/head.log"; do sleep 1; done
for i in 0 1; do
    ray start --block --address "127.0.0.1:$PORT" --node-ip-address 127.0.0.1 --num-cpus 1 \
        --resources "{\"cpu_slot_$i\": 1, \"cpu_llc_${i}to${i}\": 1}" --disable-usage-stats \
        --temp-dir "$BASE/w$i" >"$BASE/w$i.log" 2>&1 &
    PIDS=("$!" "${PIDS[@]}")
done
for i in 0 1; do until grep -q "block forever" "$BASE/w$i.log"; do sleep 1; done; done
ray status --address "127.0.0.1:$PORT" | sed -n '/Active:/,/Pending:/p'

start=$(date +%s)
collage-farm tune "$MODEL" --address "127.0.0.1:$PORT" --out "$BASE/out" --json \
    >"$BASE/summary.json" 2>"$BASE/tune.log"
echo "campaign wall time: $(( $(date +%s) - start )) s"
grep "farm: .* runners" "$BASE/tune.log" | sed 's/.*INFO //'
python3 - "$BASE/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print("slots:", [(h["node"], h["slots"], h["llc_domains"]) for h in s["slots"]["per_host"]])
print("measured:", s["measured"], "| written plan:", s["written_plan"],
      "| measured end to end: %.4g ms" % (s["plan_measured_s"] * 1e3))
print(s["story"][2]["text"])
EOF
for n in head w0 w1; do
    printf '%s: RunnerActor workers: %s\n' "$n" \
        "$(grep -l 'actor_name:RunnerActor' "$BASE/$n"/session_latest/logs/worker-*.err 2>/dev/null | wc -l)"
done
echo "logs and plan: $BASE"
