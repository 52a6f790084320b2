"""Facts about Vela (ethos-u-vela) that do not need Vela imported: its vela.ini and defaults.

The ``system_config`` and ``memory_mode`` of a Vela target are section names of the ``vela.ini``
bundled with ethos-u-vela (``System_Config.<name>``, ``Memory_Mode.<name>``); the board's core
clock is that system config's ``core_clock``. `vela_ini_sections` reads them without importing
Vela (so a configuration can be checked on a machine where Vela would be slow to import) and
falls back to the names shipped with Vela 5.2 where Vela is not installed. `VELA_DEFAULTS` is
what Vela itself picks when neither is given, per accelerator family.
"""

from __future__ import annotations

import configparser
import importlib.util
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

__all__ = [
    "VELA_DEFAULTS",
    "VELA_MEMORY_MODES",
    "VELA_SYSTEM_CONFIGS",
    "accelerator_family",
    "vela_family",
    "vela_ini_path",
    "vela_ini_sections",
    "vela_memory_modes",
    "vela_system_configs",
]

# Vela's section names as shipped with ethos-u-vela 5.2 (used when Vela is not installed here).
VELA_SYSTEM_CONFIGS = (
    "Ethos_U55_Deep_Embedded", "Ethos_U55_High_End_Embedded", "Ethos_U65_Embedded",
    "Ethos_U65_Mid_End", "Ethos_U65_High_End", "Ethos_U65_Client_Server",
    "Ethos_U85_SYS_Flash_Low", "Ethos_U85_SYS_Flash_High", "Ethos_U85_SYS_DRAM_Low",
    "Ethos_U85_SYS_DRAM_Mid", "Ethos_U85_SYS_DRAM_High",
)
VELA_MEMORY_MODES = (
    "Sram_Only", "Shared_Sram", "Dedicated_Sram", "Dedicated_Sram_256KB",
    "Dedicated_Sram_384KB", "Dedicated_Sram_512KB",
)
# What Vela itself picks when no --system-config / --memory-mode is given
# (ArchitectureFeatures._set_default_sys_config / _set_default_mem_mode in Vela 5.2).
VELA_DEFAULTS = {
    "u55": ("Ethos_U55_High_End_Embedded", "Shared_Sram"),
    "u65": ("Ethos_U65_Client_Server", "Dedicated_Sram_384KB"),
    "u85": ("Ethos_U85_SYS_DRAM_Mid", "Dedicated_Sram_384KB"),
}


def vela_ini_path() -> Path | None:
    """The vela.ini shipped with the installed ethos-u-vela, without importing Vela."""
    try:
        spec = importlib.util.find_spec("ethosu")
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = Path(loc) / "config_files" / "Arm" / "vela.ini"
        if p.is_file():
            return p
    return None


@lru_cache(maxsize=1)
def vela_ini_sections() -> tuple[tuple[str, ...], tuple[str, ...], dict[str, float]]:
    """(system configs, memory modes, core clock per system config) from the installed vela.ini.

    Falls back to the names of Vela 5.2 when Vela is not installed (an offline laptop).
    """
    path = vela_ini_path()
    if path is None:
        return VELA_SYSTEM_CONFIGS, VELA_MEMORY_MODES, {}
    ini = configparser.ConfigParser()
    ini.read(path)
    systems, modes, clocks = [], [], {}
    for sec in ini.sections():
        kind, _, name = sec.partition(".")
        if kind == "System_Config":
            systems.append(name)
            if ini.has_option(sec, "core_clock"):
                clocks[name] = float(ini.get(sec, "core_clock"))
        elif kind == "Memory_Mode":
            modes.append(name)
    return tuple(systems), tuple(modes), clocks


def accelerator_family(accelerator: str) -> str:
    """``"u85"``, ``"u65"`` or ``"u55"``: the family of a Vela accelerator configuration."""
    for fam in ("u85", "u65"):
        if accelerator.startswith(f"ethos-{fam}"):
            return fam
    return "u55"


def vela_family(options: Mapping[str, object]) -> str:
    """``"u85"``, ``"u65"`` or ``"u55"``: the accelerator family of a Vela target's options."""
    return accelerator_family(str(options.get("accelerator_config", "")))


def vela_system_configs(options: Mapping[str, object]) -> tuple[object, ...]:
    """The vela.ini system configs of the options' accelerator family."""
    prefix = f"Ethos_{vela_family(options).upper()}_"
    return tuple(s for s in vela_ini_sections()[0] if s.startswith(prefix))


def vela_memory_modes(options: Mapping[str, object]) -> tuple[object, ...]:
    """The vela.ini memory modes (any of them fits every accelerator family)."""
    return vela_ini_sections()[1]
