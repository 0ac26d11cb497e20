"""Guarded imports of optional dependencies."""

from __future__ import annotations

import importlib
from types import ModuleType

from mythic._errors import MissingExtraError


def require(module: str, *, package: str, extra: str) -> ModuleType:
    """Import `module`, or raise `MissingExtraError` naming the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(package, extra) from exc
