"""An earlier revision's module, for a migration that rebuilds a PostgreSQL function from the text
an earlier revision wrote (one edit on top of it, so the claim rule stays written once per revision).
Revision files start with a digit, so they are loaded by path, not imported."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

VERSIONS = Path(__file__).with_name("versions")


def previous(name: str) -> ModuleType:
    """The module of revision file ``name`` in ``versions/``."""
    path = VERSIONS / name
    spec = importlib.util.spec_from_file_location(f"_streamledger_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
