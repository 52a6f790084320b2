# Sourced by the loopback bench scripts: the node PIDs they start, stopped at exit.
# Each node is a `ray start --block` in the background, so killing its PID drains and stops
# exactly that node (`ray stop` would stop every Ray on the host, other users' included);
# a script adds each PID in front of PIDS, so the head (started first) is stopped last.
export RAY_AUTH_MODE=token  # `ray start --head` turns token auth on; every node must say so
PIDS=()
stop_nodes() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_nodes EXIT
