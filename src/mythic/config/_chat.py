"""`chat`: sampling and history of a conversation with one NPC."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from mythic.config._section import Section


class ChatSettings(Section):
    """Sampling and history for a conversation with one NPC."""

    max_tokens: int = Field(default=200, ge=1, le=4096)
    """Longest reply, in tokens."""

    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    """Sampling temperature; 0 is greedy."""

    top_p: float = Field(default=0.9, gt=0.0, le=1.0)
    """Nucleus sampling threshold."""

    top_k: int = Field(default=40, ge=0)
    """Sample among the k most likely tokens (0: no limit)."""

    repeat_penalty: float = Field(default=1.1, ge=1.0, le=2.0)
    """Penalty on recently generated tokens."""

    dry_multiplier: float = Field(default=0.8, ge=0.0, le=5.0)
    """DRY ("don't repeat yourself"): a token that would extend a stretch of text already said
    (`dry_scope`: by default the NPC's earlier lines) or already in the reply loses
    `dry_multiplier * dry_base ** (length - dry_allowed_length)` from its logit. 0 turns it
    off. llama.cpp backend only (the transformers backend ignores it, with a warning)."""

    dry_scope: Literal["lines", "prompt", "reply"] = "lines"
    """What DRY counts as already said besides the reply: `lines`, the NPC's earlier lines in
    the conversation; `prompt`, the whole prompt, persona and lore included (the NPC then
    words the facts it should quote exactly differently, or misspells them); `reply`,
    nothing."""

    dry_base: float = Field(default=1.75, ge=1.0, le=4.0)
    """How fast the DRY penalty grows with each further repeated token."""

    dry_allowed_length: int = Field(default=2, ge=1, le=64)
    """Repeats up to this many tokens long (names, set phrases) go unpenalised by DRY."""

    dry_penalty_last_n: int = Field(default=-1, ge=-1, le=1_048_576)
    """Tokens DRY looks back over, the last of what `dry_scope` counts as said included: -1
    the whole context window, 0 off."""

    dry_sequence_breakers: list[Annotated[str, Field(min_length=1, max_length=40)]] = Field(
        default_factory=lambda: ["\n", ":", '"', "*"]
    )
    """Text a DRY repeat never reaches back across (llama.cpp's default): after a line break
    or a colon, a repeat starts counting again."""

    history_turns: int = Field(default=16, ge=0, le=200)
    """Player/NPC exchanges kept in the prompt, at most. The prompt's window of the history
    keeps its first exchange from line to line (so the engine's cache of the prompt holds)
    and, past this many, jumps to the newest half; older ones also drop first when the
    context fills."""
