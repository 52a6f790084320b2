"""Joining or starting Ray, and the questions about the cluster the farm asks it.

Auth: Ray's token authentication stays on. An embedded ``ray.init()`` enables it by default
and a cluster joined with ``--address`` needs its token (``~/.ray/auth_token`` or
``RAY_AUTH_TOKEN``); only tests set ``RAY_AUTH_MODE=disabled``, and `connect` warns whenever it
finds authentication disabled.

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from collage_farm.farm.messages import FarmError
from collage_farm.farm.resources import LocalResources, local_resources, toolchain_kinds

log = logging.getLogger(__name__)


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
    Token authentication is Ray's default and is left alone.
    """
    import ray

    if ray.is_initialized():
        log.info("farm: using the Ray runtime already initialised in this process")
        return False
    env = dict(runtime_env) if runtime_env else None
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        check_reachable(address)
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
        ray.init(address="local", num_cpus=local.num_cpus, num_gpus=local.num_gpus,
                 resources=local.resources, include_dashboard=False, namespace=namespace,
                 runtime_env=env, logging_level=logging.WARNING)
        _session.embedded = local
        started = True
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
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
