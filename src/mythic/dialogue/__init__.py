"""Turn orchestration: NPC actors, their dialogue state machine, intents and game tool calls.

`Conversation` is the terminal's single-NPC path; `Cast` runs the NPCs of a server, one actor
per active NPC, and talks to the game through an `Outbox` of v1 messages.
"""

from mythic.dialogue._actor import INTERRUPTED_NOTE, NPCActor, Scene, TurnRecord
from mythic.dialogue._cast import (
    Cast,
    DialogueStats,
    Outbox,
    ReplySink,
    ToolOutcome,
    UnknownCallError,
    UnknownNPCError,
)
from mythic.dialogue._conversation import Conversation, PlayerInputError
from mythic.dialogue._mailbox import Lane, Mailbox, MailboxClosedError, MailboxFullError
from mythic.dialogue._naturalness import (
    ASSISTANT_SPEAK,
    Finding,
    LineFilter,
    Secret,
    admitted,
    affirmed,
    assistant_phrases,
    begins_as,
    deflected,
    deflection,
    echoes,
    greeting_lead,
    greets,
    leaked,
    name_forms,
    narrates_self,
    normalise,
    opening,
    repeats,
    secrets_of,
    sentences,
)
from mythic.dialogue._phrases import PhraseBuffer
from mythic.dialogue._states import (
    TRANSITIONS,
    DialogueState,
    DialogueStateMachine,
    IllegalTransitionError,
)
from mythic.dialogue._tools import (
    INTENTS,
    TOOLS,
    TOOLS_BY_INTENT,
    Tool,
    ToolArgumentError,
    decision_schema,
    npc_tools,
    validate_call,
)
from mythic.knowledge import persona_prompt

__all__ = [
    "ASSISTANT_SPEAK",
    "INTENTS",
    "INTERRUPTED_NOTE",
    "TOOLS",
    "TOOLS_BY_INTENT",
    "TRANSITIONS",
    "Cast",
    "Conversation",
    "DialogueState",
    "DialogueStateMachine",
    "DialogueStats",
    "Finding",
    "IllegalTransitionError",
    "Lane",
    "LineFilter",
    "Mailbox",
    "MailboxClosedError",
    "MailboxFullError",
    "NPCActor",
    "Outbox",
    "PhraseBuffer",
    "PlayerInputError",
    "ReplySink",
    "Scene",
    "Secret",
    "Tool",
    "ToolArgumentError",
    "ToolOutcome",
    "TurnRecord",
    "UnknownCallError",
    "UnknownNPCError",
    "admitted",
    "affirmed",
    "assistant_phrases",
    "begins_as",
    "decision_schema",
    "deflected",
    "deflection",
    "echoes",
    "greeting_lead",
    "greets",
    "leaked",
    "name_forms",
    "narrates_self",
    "normalise",
    "npc_tools",
    "opening",
    "persona_prompt",
    "repeats",
    "secrets_of",
    "sentences",
    "validate_call",
]
