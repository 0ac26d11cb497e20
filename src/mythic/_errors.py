"""The root of Mythic's error hierarchy."""

from __future__ import annotations


class MythicError(Exception):
    """Base class of every error Mythic raises on purpose.

    Attributes:
        retryable: whether the same call may succeed if repeated unchanged (a busy backend),
            as opposed to a permanent failure (a corrupt model file, a malformed card).
        fix: a command or action that resolves the error, shown to the user when set.
    """

    retryable: bool = False

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        if self.fix:
            return f"{self.message}\n  fix: {self.fix}"
        return self.message


class MissingExtraError(MythicError, ImportError):
    """An optional dependency is not installed; the message names the install command."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(
            f"{package} is not installed; it is part of the '{extra}' extra",
            fix=f"pip install 'mythic[{extra}]'  (or run `make run` in a checkout)",
        )
        self.package = package
        self.extra = extra
