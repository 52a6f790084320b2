"""Joining or starting Ray, and the questions about the cluster the farm asks it.

Auth: Ray's token authentication stays on. An embedded Ray gets it as Ray's own default
(`token_auth_quietly`: without Ray's warning that tells users how to turn it off), ``auto``
uses it when a token exists (as Ray does), and a cluster joined at ``HOST:PORT`` needs
``RAY_AUTH_MODE=token`` and its token (``~/.ray/auth_token`` or ``RAY_AUTH_TOKEN``); only
tests set ``RAY_AUTH_MODE=disabled``, and `connect` warns whenever it finds authentication
disabled.

Joining fails fast: `check_reachable` (TCP) and `check_gcs_answers` (a GCS request in a
daemon thread, bounded) run before `ray.init`, which would otherwise retry a silent GCS for
minutes while SIGTERM waits; ``auto`` is resolved first (`resolve_address`) so it is checked
too.

One piece of module state: `_session`, what `connect` started in this process. Ray is a
per-process singleton (one ``ray.init`` per process, reused by every later `connect`), so what
this process started is per-process too, and a `Farm.start` after an earlier `connect` (the
benchmark starts Ray once for several farms) must still learn which cores the embedded Ray kept
for GPU runners. `shutdown` clears it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from collage_farm.farm.messages import FarmError
from collage_farm.farm.resources import LocalResources, local_resources, toolchain_kinds

log = logging.getLogger(__name__)

AUTH_MODE_ENV = "RAY_AUTH_MODE"

#: how long a Ray GCS may take to answer before joining its cluster is given up (seconds)
GCS_ANSWER_S = 10.0
#: an embedded Ray's workers' niceness on top of the driver's (Ray's default adds 15)
WORKER_NICENESS = 0


@dataclass
class _Session:
    """What `connect` started in this process: the embedded Ray's resources, or None."""

    embedded: LocalResources | None = None


_session = _Session()


def connect(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    ethosu_slots: int | None = None,
    toolchains: Iterable[str] | None = None,
    namespace: str | None = None,
    runtime_env: Mapping[str, Any] | None = None,
) -> bool:
    """Connect this process to Ray; True when this call started an embedded local Ray.

    Already initialised: used as is. ``address`` (or ``RAY_ADDRESS``): join that cluster
    (``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``). Otherwise start a local Ray whose
    resources are this machine's measurement slots (`local_resources`), always a new instance
    (``address="local"``), never a stray cluster named by ``/tmp/ray/ray_current_cluster``.
    Its workers run at this process's priority (Ray's ``worker_niceness`` is an increment on
    the niceness they inherit: `WORKER_NICENESS` 0 instead of Ray's default 15), so a campaign
    started under ``nice`` stays behind foreground work and one started without it is not
    pushed behind background jobs: runners are timing slots, and at nice 15 any background
    job on the host takes their cores (a profile run of gpt2-2L timed out at 120 s beside
    nice-15 jobs). Token authentication is Ray's default and is left alone.
    """
    import ray

    if ray.is_initialized():
        log.info("farm: using the Ray runtime already initialised in this process")
        return False
    env = dict(runtime_env) if runtime_env else None
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        if address == "auto":  # as `ray.init("auto")` does: token auth when a token exists
            token_auth_quietly(need_token=True)
        address = resolve_address(address)
        check_reachable(address)
        check_gcs_answers(address)
        try:
            ray.init(address=address, namespace=namespace, runtime_env=env,
                     logging_level=logging.WARNING)
        except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
            why = " ".join(str(e).split())[:300]
            raise FarmError(f"cannot join the Ray cluster at {address!r}: "
                            f"{type(e).__name__}: {why} (is it running? `ray status` there; "
                            "ray://HOST:10001 or HOST:6379)") from None
        started = False
    else:
        kinds = toolchain_kinds(toolchains).values()
        local = local_resources(num_cpus, num_gpus, ethosu_slots, kinds)
        token_auth_quietly(need_token=False)  # Ray's default, without its opt-out nudge
        ray.init(address="local", num_cpus=local.num_cpus, num_gpus=local.num_gpus,
                 resources=local.resources, include_dashboard=False, namespace=namespace,
                 runtime_env=env, logging_level=logging.WARNING,
                 _system_config={"worker_niceness": WORKER_NICENESS})
        _session.embedded = local
        started = True
    if os.environ.get(AUTH_MODE_ENV, "").lower() == "disabled":
        log.warning("farm: Ray token authentication is disabled (RAY_AUTH_MODE=disabled); "
                    "anyone who can reach the cluster can run code on it")
    return started


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast when nothing listens at a ``HOST:PORT`` or ``ray://HOST:PORT`` address:
    `ray.init` retries an unreachable GCS for minutes (seen hanging > 150 s on 127.0.0.1:1).
    ``auto`` and other forms are left to Ray."""
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        raise FarmError(f"cannot join the Ray cluster at {address!r}: nothing answers at "
                        f"{host}:{port} ({e.strerror or e}); is the head running "
                        "(`ray status` there), and is the port open to this machine?") from None


def token_auth_quietly(*, need_token: bool) -> bool:
    """Turn Ray's token authentication on for this process and its children, as Ray does by
    default for a local cluster, but without the warning Ray prints then ("Token
    authentication is enabled ... Set RAY_AUTH_MODE=disabled to opt out"): it nudges users to
    turn security off. ``need_token``: only when a token exists already (``~/.ray/auth_token``
    or ``RAY_AUTH_TOKEN``), as Ray does for ``address="auto"``; otherwise `ray.init` creates
    the token of a new local cluster. A ``RAY_AUTH_MODE`` the user set is left as it is.
    True when token auth is on."""
    mode = os.environ.get(AUTH_MODE_ENV)
    if mode is not None:
        return mode.lower() == "token"
    # private API: Ray is pinned (pyproject); it sets the variable and refreshes Ray's config
    from ray._private.authentication import authentication_token_setup as auth

    if need_token and not auth.AuthenticationTokenLoader.instance().has_token(
            ignore_auth_mode=True):
        return False
    auth._enable_token_auth()
    return True


def resolve_address(address: str) -> str:
    """``auto``: the ``HOST:PORT`` of the cluster `ray.init` would join (the last ``ray
    start`` on this host, else the one Ray GCS process running here), so that it can be
    checked before joining; other forms unchanged. FarmError when there is none, or several
    and no ``ray start`` says which."""
    if address != "auto":
        return address
    from ray._private import services  # private API: Ray is pinned (pyproject)

    try:
        return str(services.canonicalize_bootstrap_address_or_die("auto"))
    except (ConnectionError, ValueError) as e:
        why = " ".join(str(e).split())[:300]
        raise FarmError(f"cannot join the Ray cluster at 'auto': {why}") from None


def check_gcs_answers(address: str, timeout_s: float = GCS_ANSWER_S) -> None:
    """Fail within ``timeout_s`` when the Ray GCS at a ``HOST:PORT`` address does not answer.

    A port that accepts connections but never answers as Ray's GCS (a stuck head, another
    program, a cluster of another Ray version) makes `ray.init` retry for minutes, printing
    "Failed to get cluster ID from GCS server" and deaf to SIGTERM while it waits in C++. So
    one GCS client asks for the cluster id in a daemon thread first, and this thread waits for
    it at most ``timeout_s`` (a live GCS answers in milliseconds); while waiting, SIGTERM and
    SIGINT end the process as usual. ``ray://`` (Ray Client) addresses are left to Ray.
    """
    if address.startswith("ray://") or ":" not in address:
        return
    from ray._raylet import GcsClient

    answer: list[str | None] = []

    def ask() -> None:
        try:
            GcsClient(address=address).cluster_id  # noqa: B018 - the request is the point
            answer.append(None)
        except Exception as e:  # any failure is the answer
            answer.append(f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")

    probe = threading.Thread(target=ask, name="gcs-probe", daemon=True)
    probe.start()
    probe.join(timeout_s)
    if not answer:
        raise FarmError(f"cannot join the Ray cluster at {address!r}: something listens there "
                        f"but no Ray GCS answered within {timeout_s:g} s (a stuck head, "
                        "another program on that port, or a Ray of another version?); "
                        "`ray status --address` there says which")
    if answer[0] is not None:
        raise FarmError(f"cannot join the Ray cluster at {address!r}: {answer[0]}")


def shutdown() -> None:
    """Disconnect from Ray (and stop the embedded Ray `connect` started)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    _session.embedded = None


def alive_nodes() -> list[dict[str, Any]]:
    """The cluster's alive nodes, as ``ray.nodes()`` describes them."""
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def node_alive(node_id: str) -> bool:
    """Whether Ray still lists ``node_id`` as alive (True when Ray cannot be asked)."""
    import ray

    try:
        for n in ray.nodes():
            if n["NodeID"] == node_id:
                return bool(n.get("Alive"))
    except Exception:
        return True
    return False


def gpu_cores_here() -> dict[str, tuple[int, ...]]:
    """Node id -> cores kept for GPU runners, for the node of an embedded Ray started here."""
    import ray

    local = _session.embedded
    if local is None:
        return {}
    return {ray.get_runtime_context().get_node_id(): local.gpu_cores}
