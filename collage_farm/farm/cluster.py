"""Ray's own view of a cluster launcher config (``cluster.yaml``), for ``collage-farm cluster``.

The CLI's offline check validates a config the way ``ray up`` does before provisioning. What
it needs from Ray lives here, because the farm is the project's only package that imports
``ray``: the JSON schema Ray validates with, and Ray's preparation (the provider's defaults
merged in) plus validation. Both use ``ray.autoscaler``; ``prepare_config`` and
``validate_config`` are private Ray APIs, which is one reason the project pins ``ray==2.60.0``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def autoscaler_schema() -> dict[str, Any]:
    """The JSON schema of a cluster launcher config, as shipped with Ray (``ray-schema.json``)."""
    import ray.autoscaler

    with open(Path(ray.autoscaler.__file__).parent / "ray-schema.json") as f:
        return json.load(f)  # type: ignore[no-any-return]


def prepare_and_validate(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with the provider's defaults merged in and validated, exactly as ``ray up``.

    Raises what Ray raises for an invalid config (``jsonschema.ValidationError``,
    ``ValueError``, or a ``click`` exception from Ray's CLI logger); ``config`` is not
    modified.
    """
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared: dict[str, Any] = prepare_config(copy.deepcopy(dict(config)))
    validate_config(prepared)
    return prepared
