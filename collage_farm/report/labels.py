"""Human labels for the report: no raw ``snake_case`` key reaches a reader.

Every key the page shows (campaign statistics, cost-table kinds and statuses) goes through
`label`, which looks it up in `LABELS` and otherwise turns the key into words ("cache_hits" ->
"cache hits"), so a key added to a summary later still reads as words; cost-table kinds and
statuses go through `kind_words` and `status_words`. `SUMMARY_KEYS` is the order the campaign
table lists its statistics in.
"""

from __future__ import annotations

from runners.base import Kind, Status

__all__ = ["KIND_WORDS", "LABELS", "STATUS_WORDS", "SUMMARY_KEYS", "SUMMARY_LABELS",
           "kind_words", "label", "status_words"]

SUMMARY_KEYS = ("nodes", "candidates", "distinct_fingerprints", "costs_requested", "measured",
                "cache_hits", "pruned", "analytic", "failed", "states_expanded", "search_s",
                "post_search_s", "wall_s")

#: how the report names each of `SUMMARY_KEYS`
SUMMARY_LABELS = {
    "nodes": "model nodes", "candidates": "candidate partitions",
    "distinct_fingerprints": "distinct candidates (fingerprints)",
    "costs_requested": "costs asked for", "measured": "candidates measured now",
    "cache_hits": "costs answered by the cost table", "pruned": "pruned by the lower bound",
    "analytic": "analytic estimates", "failed": "candidates that failed",
    "states_expanded": "search states expanded", "search_s": "search time (s)",
    "post_search_s": "refine and never-worse time (s)", "wall_s": "campaign wall time (s)",
}

#: every summary key the report may show, in words
LABELS: dict[str, str] = {**SUMMARY_LABELS, "partitions": "partitions",
                          "estimated_total_s": "estimated total (s)"}
#: where a cost-table figure comes from, in words
KIND_WORDS: dict[Kind, str] = {Kind.MEASURED: "measured", Kind.PROFILED: "profiled in network",
                               Kind.SIMULATED: "simulated", Kind.ANALYTIC: "analytic"}
#: a failed cost-table row's status, in words
STATUS_WORDS: dict[Status, str] = {
    Status.OK: "ok", Status.UNSUPPORTED: "unsupported", Status.BUILD_FAILED: "build failed",
    Status.RUNTIME_ERROR: "run failed", Status.TIMEOUT: "timed out", Status.CRASHED: "crashed"}


def label(key: str) -> str:
    """A summary key in words: its `LABELS` entry, else the key with underscores as spaces."""
    return LABELS.get(key, key.replace("_", " "))


def kind_words(kind: str) -> str:
    """A cost-table ``kind`` value in words (`KIND_WORDS`; unknown values as they are)."""
    try:
        return KIND_WORDS[Kind(kind)]
    except ValueError:
        return kind.replace("_", " ")


def status_words(status: str) -> str:
    """A cost-table ``status`` value in words (`STATUS_WORDS`; unknown values as words)."""
    try:
        return STATUS_WORDS[Status(status)]
    except ValueError:
        return status.replace("_", " ")
