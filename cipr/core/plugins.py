"""Your own code, imported by name before a command runs: `plugins=[my_module,...]` (cipr-eval).

A plugin is any module importable from PYTHONPATH that registers what it adds when imported, through the
package's public registration functions (`cipr.perturb.registry.register_perturbation`, ...), so a
researcher extends the project from their own file, never by editing it (docs/extending.md). A module that
cannot be imported is a ConfigError naming the option and the module, before any work.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType

from cipr.core.errors import ConfigError


def import_plugins(modules: Sequence[str], option: str = "plugins") -> list[ModuleType]:
    """Import each module of `modules` (dotted names), in order; ConfigError naming `option` on failure."""
    out = []
    for name in modules:
        try:
            out.append(importlib.import_module(name))
        except ImportError as e:
            raise ConfigError(f"{option}: cannot import {name!r} ({e}); is its folder on "
                              f"PYTHONPATH?") from None
        except Exception as e:  # noqa: BLE001 - the user's module failed while registering: one clear line
            raise ConfigError(f"{option}: importing {name!r} failed: {type(e).__name__}: {e}") from None
    return out
