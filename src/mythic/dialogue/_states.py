"""The dialogue state machine of one NPC (technical design, section 5.1)."""

from __future__ import annotations

import enum
from collections.abc import Callable

from mythic._errors import MythicError


class DialogueState(enum.StrEnum):
    """Where an NPC is in a conversation; the values are the wire's `NPCState.state`."""

    IDLE = "idle"
    LISTENING = "listening"
    THINKING = "thinking"
    SPEAKING = "speaking"
    BARGE_IN = "barge_in"


_S = DialogueState
TRANSITIONS: dict[DialogueState, frozenset[DialogueState]] = {
    _S.IDLE: frozenset({_S.LISTENING}),
    # Listening ends with a line to answer, or with nothing (the line was refused).
    _S.LISTENING: frozenset({_S.THINKING, _S.IDLE, _S.BARGE_IN}),
    # Thinking can end without a word (an error, an empty reply).
    _S.THINKING: frozenset({_S.SPEAKING, _S.IDLE, _S.BARGE_IN}),
    # Speaking goes back to thinking while a tool call is out and its result is voiced.
    _S.SPEAKING: frozenset({_S.THINKING, _S.IDLE, _S.BARGE_IN}),
    _S.BARGE_IN: frozenset({_S.LISTENING, _S.IDLE}),
}
"""The allowed moves; anything else is a bug in the actor."""


class IllegalTransitionError(MythicError):
    """The actor tried a move the state machine does not allow."""


class DialogueStateMachine:
    """The current state, the moves allowed from it, and a listener told of every change."""

    def __init__(self, on_change: Callable[[DialogueState], None] | None = None) -> None:
        self.state = DialogueState.IDLE
        self._on_change = on_change

    def to(self, state: DialogueState) -> None:
        """Move to `state`; staying put is a no-op.

        Raises:
            IllegalTransitionError: `state` cannot follow the current state.
        """
        if state is self.state:
            return
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransitionError(f"{self.state} -> {state} is not a dialogue transition")
        self.state = state
        if self._on_change is not None:
            self._on_change(state)
