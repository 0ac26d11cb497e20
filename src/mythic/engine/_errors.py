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


class RequestError(MythicError):
    """One generation request was refused or failed; the engine itself is fine."""


class InvalidRequestError(RequestError):
    """The request is malformed: no prompt, bad sampling values, an empty stop string..."""


class ContextOverflowError(InvalidRequestError):
    """The prompt does not fit the model's context and the overflow policy is `error`."""


class GrammarError(InvalidRequestError):
    """A JSON schema or GBNF grammar could not be converted or parsed."""


class UnknownAdapterError(InvalidRequestError):
    """The request names a LoRA adapter the engine has not loaded."""


class AdapterError(MythicError):
    """A LoRA adapter could not be loaded or unloaded (missing, not a GGUF adapter, wrong base
    model, not loaded)."""


class AdapterInUseError(AdapterError):
    """An adapter that queued or running requests use cannot be unloaded now; it can be once
    they finish."""

    retryable = True


class AdapterBudgetError(AdapterError):
    """No room for one more adapter under the memory budget: the resident ones are all in use
    (retryable), or the adapter alone is larger than the budget (permanent)."""

    def __init__(self, message: str, *, retryable: bool, fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.retryable = retryable


class Overloaded(RequestError):  # noqa: N818 - the name is the condition the caller handles
    """The engine's queue is full: the request was refused rather than answered late."""

    retryable = True


class DeadlineExceeded(RequestError):  # noqa: N818 - the name is the condition the caller handles
    """The request could not finish before its deadline; use the fallback line now."""

    retryable = True


class RequestCancelled(RequestError):  # noqa: N818 - the name is the condition the caller handles
    """The request was cancelled (barge-in) before it finished."""


class EngineError(MythicError):
    """The backend failed while this request was in flight; the engine has recovered."""

    retryable = True


class EngineClosedError(EngineError):
    """The engine was closed; it accepts no more requests."""

    retryable = False
