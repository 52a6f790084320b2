"""Toolchain options read from configuration files, checked against `runners.options`.

A target's options are validated against its toolchain's `OptionSpec`s (names, types, values;
choices may depend on the other options, as Vela's system configs depend on the accelerator),
then made *canonical*: explicit defaults are written in, defaults the toolchain applies by
itself are dropped when stated, so two spellings of one target have one `Target.measure_key`.
An app's overrides of a system target may repeat a locked option (a hardware fact), never
change it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collage_farm.config.reader import KIND_ALLOWED, Reader, check_type, join_key
from collage_farm.core.target import Target
from runners.options import TOOLCHAIN_OPTIONS, full_options

__all__ = ["canonical_options", "override_options", "validate_options"]


def validate_options(r: Reader, path: str, toolchain: str, raw: Mapping[str, Any]
                     ) -> dict[str, object]:
    """Check option names, types and values (choices may depend on the other options)."""
    specs = TOOLCHAIN_OPTIONS.get(toolchain, {})
    opts = dict(r.mapping(raw, path, list(specs)))
    for key, val in opts.items():
        s = specs[key]
        check_type(r, join_key(path, key), val, s.kind, None, s.minimum, False)
    for key, val in opts.items():
        choices = specs[key].choices_for(opts)
        if choices is not None and val not in choices:
            raise r.error(join_key(path, key), f"{val!r} is not allowed for toolchain "
                          f"{toolchain!r}", choices)
    return opts


def canonical_options(r: Reader, path: str, toolchain: str, opts: Mapping[str, object]
                      ) -> dict[str, object]:
    """Validated ``opts`` with required options checked, explicit defaults written in and
    implicit defaults dropped (one spelling per target)."""
    specs = TOOLCHAIN_OPTIONS.get(toolchain, {})
    out = dict(opts)
    for key, s in specs.items():
        if s.required and key not in out:
            choices = s.choices_for(out)
            raise r.error(join_key(path, key), f"toolchain {toolchain!r} needs option {key!r}",
                          choices if choices is not None else KIND_ALLOWED[s.kind])
        d = s.default_for(out)
        if s.explicit and key not in out and d is not None:
            out[key] = d
        elif not s.explicit and key in out and out[key] == d:
            del out[key]
    return out


def override_options(r: Reader, path: str, base: Target, raw: Mapping[str, Any],
                     system_file: str) -> Target:
    """``base`` with the app's option overrides (locked options may only repeat)."""
    specs = TOOLCHAIN_OPTIONS.get(base.toolchain, {})
    new = validate_options(r, path, base.toolchain, raw)
    current = full_options(base.toolchain, dict(base.options))
    for key, val in new.items():
        if specs[key].locked and current.get(key) != val:
            raise r.error(join_key(path, key),
                          f"conflict: {system_file} sets {key}={current.get(key)!r} for target "
                          f"{base.name!r} and an app may not change it (a hardware fact)",
                          [current.get(key)])
    merged = {**dict(base.options), **new}
    merged = validate_options(r, path, base.toolchain, merged)
    return Target.make(base.name, base.toolchain, base.device,
                       canonical_options(r, path, base.toolchain, merged))
