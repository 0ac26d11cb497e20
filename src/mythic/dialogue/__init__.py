"""Turn orchestration: an NPC's persona, its conversation history, its replies."""

from mythic.dialogue._conversation import Conversation, PlayerInputError, persona_prompt

__all__ = ["Conversation", "PlayerInputError", "persona_prompt"]
