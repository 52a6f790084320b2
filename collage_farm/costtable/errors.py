"""The cost table's warning and error: a skipped part file, a table that cannot be used."""

from __future__ import annotations


class CostTableWarning(UserWarning):
    """A part file was skipped (corrupt, truncated or not a cost-table file)."""


class CostTableError(RuntimeError):
    """A cost table cannot be used: not a directory, not writable, a write that failed.

    The message names the directory and the reason; where rows could not be written it also
    names the rescue file that holds them (`CostTableWriter.close`).
    """
