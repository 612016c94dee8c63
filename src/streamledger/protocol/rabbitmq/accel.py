"""Loader of the optional C accelerator (``_accel.c`` next to this file).

The C loops cover the stream data plane's hot path: splitting chunk entries and cutting AMQP 1.0
bodies out of records (with a C walker for the common message shapes, calling back into the shared
codec's types). Everything has a pure-Python twin giving identical results; the twins are used when
the module is not built, is stale, or ``STREAMLEDGER_PURE_PYTHON`` is set.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

from streamledger.protocol.amqp10.codec.types import PROPERTY_FIELDS, Symbol, timestamp_value, uuid_from_bytes


def configure(module: ModuleType) -> ModuleType:
    """Hand the C module the Python types it builds values with (symbols, timestamps, uuids)."""
    module.configure(Symbol, timestamp_value, uuid_from_bytes, PROPERTY_FIELDS)
    return module


def load_accelerator() -> ModuleType | None:
    """The optional C loops (``_accel``), or ``None`` to use the pure-Python ones.

    ``None`` when ``STREAMLEDGER_PURE_PYTHON`` is set, when the module is not built, or when the
    built file is older than ``_accel.c`` next to it (a stale build after a source update: it is
    not even imported, and a warning says how to rebuild).
    """
    if os.environ.get("STREAMLEDGER_PURE_PYTHON"):
        return None
    name = f"{__package__}._accel"
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    source = Path(__file__).with_name("_accel.c")
    try:
        stale = source.stat().st_mtime > Path(spec.origin).stat().st_mtime
    except OSError:
        stale = False  # no source next to the build (an installed wheel)
    if stale and name not in sys.modules:
        warnings.warn(f"{spec.origin} is older than {source.name}; using the pure-Python decoder "
                      f"(rebuild: python -m {__package__}._accel_build)", RuntimeWarning, stacklevel=2)
        return None
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    return configure(module)


ACCEL = load_accelerator()
