"""Errors of the engine layer."""

from __future__ import annotations

from mythic._errors import MythicError


class ModelError(MythicError):
    """A model cannot be used: unknown, not installed, corrupt, or failed to load."""


class UnknownModelError(ModelError):
    """The name is neither a packaged model nor a path to a file."""


class ModelNotInstalledError(ModelError):
    """A packaged model's packages are not installed or its file is not assembled yet."""


class ModelIntegrityError(ModelError):
    """A model file's size or sha256 differs from the registry: it is not used."""


class NotAGGUFError(ModelError):
    """The file is missing, unreadable, or not a well-formed GGUF file."""


class ModelLoadError(ModelError):
    """llama.cpp refused to load a file that passed the checks (unsupported architecture...)."""
