"""Turn orchestration: NPC actors, their dialogue state machine, intents and game tool calls.

`Cast` runs the NPCs of a server, one actor per active NPC, and talks to the game through an
`Outbox` of v1 messages; `open_chat` plays one NPC of a cast in process, for the terminal.
"""

from mythic.dialogue._actor import NPCActor
from mythic.dialogue._cast import (
    Cast,
    UnknownCallError,
    UnknownNPCError,
    open_chains,
    read_chains,
    token_counter,
)
from mythic.dialogue._character import Scene
from mythic.dialogue._chat import Chat, PlayerInputError, open_chat
from mythic.dialogue._events import AMBIENT_NOTE, Hold, Reply
from mythic.dialogue._line_filter import LineFilter
from mythic.dialogue._mailbox import Lane, Mailbox, MailboxClosedError, MailboxFullError
from mythic.dialogue._naturalness import (
    ASSISTANT_SPEAK,
    Finding,
    Secret,
    addressed_as_self,
    admitted,
    affirmed,
    assistant_phrases,
    begins_as,
    echoes,
    greeting_lead,
    greets,
    leaked,
    name_forms,
    narrates_self,
    normalise,
    opening,
    repeats,
    said_stems,
    says_back,
    secrets_of,
    sentences,
    stepped_out,
    strange_name,
    telling,
    touched,
    world_words,
)
from mythic.dialogue._phrases import PhraseBuffer
from mythic.dialogue._refusals import REMINDED, deflected, deflection, reminder
from mythic.dialogue._session import INTERRUPTED_NOTE
from mythic.dialogue._stage import DialogueStats, Outbox, ReplySink, ToolOutcome
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
from mythic.dialogue._turn import TurnRecord, chat_sampling
from mythic.dialogue._window import KV_FILL, fill_kv
from mythic.knowledge import persona_prompt

__all__ = [
    "AMBIENT_NOTE",
    "ASSISTANT_SPEAK",
    "INTENTS",
    "INTERRUPTED_NOTE",
    "KV_FILL",
    "REMINDED",
    "TOOLS",
    "TOOLS_BY_INTENT",
    "TRANSITIONS",
    "Cast",
    "Chat",
    "DialogueState",
    "DialogueStateMachine",
    "DialogueStats",
    "Finding",
    "Hold",
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
    "Reply",
    "ReplySink",
    "Scene",
    "Secret",
    "Tool",
    "ToolArgumentError",
    "ToolOutcome",
    "TurnRecord",
    "UnknownCallError",
    "UnknownNPCError",
    "addressed_as_self",
    "admitted",
    "affirmed",
    "assistant_phrases",
    "begins_as",
    "chat_sampling",
    "decision_schema",
    "deflected",
    "deflection",
    "echoes",
    "fill_kv",
    "greeting_lead",
    "greets",
    "leaked",
    "name_forms",
    "narrates_self",
    "normalise",
    "npc_tools",
    "open_chains",
    "open_chat",
    "opening",
    "persona_prompt",
    "read_chains",
    "reminder",
    "repeats",
    "said_stems",
    "says_back",
    "secrets_of",
    "sentences",
    "stepped_out",
    "strange_name",
    "telling",
    "token_counter",
    "touched",
    "validate_call",
    "world_words",
]
