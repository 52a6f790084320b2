"""The ``collage-farm`` command line, one module per subcommand.

``tune`` (`collage_farm.cli.tune`: a campaign, phases 1-4), ``zoo`` (built-in models), ``costs``
(cost tables), ``targets`` (target configurations), ``cluster`` (cluster.yaml checks), ``run``
(execute and measure a plan) and ``compare`` (whole-model latency per toolchain);
`collage_farm.cli.main` assembles the parser and dispatches. Every user error (bad model,
unknown target, missing cost, bad config) prints one clear line on stderr and exits with status
2; nothing is half-written. The console script ``collage-farm`` is `main`.
"""

from __future__ import annotations

from collage_farm.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
