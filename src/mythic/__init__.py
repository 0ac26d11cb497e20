"""Mythic: a runtime for AI-driven game NPCs.

Importing this package is cheap on purpose: it loads no model and no heavy library. The
capabilities live in subpackages (`mythic.engine`, `mythic.knowledge`, `mythic.dialogue`, ...)
and pull in their optional dependencies only when they are used.
"""

from mythic._errors import MissingExtraError, MythicError

__version__ = "0.1.0"

__all__ = ["MissingExtraError", "MythicError", "__version__"]
