"""The call journal: the id of the last call a runner finished, in a file that outlives it.

Why: when a runner actor process dies, Ray fails every call it had not answered with the same
error (``ActorUnavailableError: ... Socket closed``, "may or may not have been executed"), and
that includes a call that had *finished* but whose reply was still in the dying process (the
actor starts its next call the moment one returns, and a candidate that kills the process on
arrival kills it within a millisecond, before the reply is sent). To tell the call it was
executing (the culprit) from those, the farm needs what only the runner knew, and its memory is
gone; but Ray restarts the actor on the same node (hard node affinity) under the same actor id,
so the new incarnation finds this file by that id and reports it with its ping
(`collage_farm.farm.messages.RunnerPing`). The file lives in the Ray session's temp directory.
Cost: one ``pwrite`` of 21 bytes per call (microseconds, next to a ~0.7 ms actor call round
trip). A process death cannot undo a write the kernel accepted; a node crash can, and then the
node is gone and nothing is struck anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os

log = logging.getLogger(__name__)


class CallJournal:
    """The id of the last call a runner finished, kept in ``path`` (in memory only if None).

    ``finished``: 0 before any call finished, None when the file could not be read (the farm
    then falls back to striking the oldest unanswered call). ``reopened``: the file was there,
    i.e. this is a restarted incarnation of the runner.
    """

    WIDTH = 20

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fd: int | None = None
        self.finished: int | None = 0
        self.reopened = False
        if path is None:
            return
        try:
            self.reopened = os.path.exists(path)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            text = os.pread(self._fd, 64, 0).decode("ascii", "replace").strip()
            self.finished = int(text) if text else 0
        except (OSError, ValueError) as e:
            log.warning("farm: runner call journal %s unreadable (%s); a death of this runner "
                        "will be charged to its oldest unanswered call", path, e)
            self.finished = None

    @classmethod
    def for_actor(cls) -> CallJournal:
        """The journal of the calling Ray actor (in memory only outside an actor)."""
        try:
            import ray  # already loaded: this runs inside a Ray actor

            ctx = ray.get_runtime_context()
            actor_id = ctx.get_actor_id()
            if not actor_id:
                return cls(None)
            folder = os.path.join(ctx.get_temp_dir(), ctx.get_session_name(), "collage-farm")
        except Exception:
            return cls(None)
        return cls(os.path.join(folder, f"calls-{actor_id}"))

    def mark(self, call: int) -> None:
        """Record that call ``call`` finished (ids grow: an actor runs its calls in order)."""
        if call <= 0:
            return
        self.finished = call
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.pwrite(self._fd, f"{call:0{self.WIDTH}d}\n".encode("ascii"), 0)

    def close(self, remove: bool = False) -> None:
        """Close the file; ``remove`` when the runner is shut down for good."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if remove and self.path:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
