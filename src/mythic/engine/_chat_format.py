"""Prompt rendering for the chat formats of the models Mythic ships.

The prompt is rendered here rather than by llama-cpp-python's chat handlers: for a model without
a template those fall back to a generic format the model was never trained on, and the shared
engine needs the rendered text anyway to reuse common prefixes between NPCs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One turn of a conversation."""

    role: Role
    content: str


class ChatFormat(StrEnum):
    """A model's chat template."""

    CHATML = "chatml"
    """`<|im_start|>role ... <|im_end|>`: SmolLM2, Qwen2.5."""
    LLAMA3 = "llama-3"
    """`<|start_header_id|>role<|end_header_id|> ... <|eot_id|>`: Llama 3.x."""
    GEMMA = "gemma"
    """`<start_of_turn>user ... <end_of_turn>`: Gemma instruct models (no system role)."""

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return _STOPS[self]

    @classmethod
    def detect(cls, template: str | None) -> ChatFormat | None:
        """Guess the format from a GGUF `tokenizer.chat_template`, or None if unknown."""
        if not template:
            return None
        for marker, fmt in _MARKERS:
            if marker in template:
                return fmt
        return None

    def render(self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True) -> str:
        """Render `messages` into a prompt; with `add_generation_prompt`, open the reply turn."""
        segments = self.render_segments(messages, add_generation_prompt=add_generation_prompt)
        return "".join(text for text, _ in segments)

    def render_segments(
        self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True
    ) -> list[tuple[str, bool]]:
        """The prompt as (text, is_template) pieces.

        Template pieces hold the format's control tokens; the others are message contents, which
        the engine tokenizes without reading control tokens, so a player who types
        `<|im_end|>` cannot close the NPC's turn or forge a system message.
        """
        if self is ChatFormat.CHATML:
            parts: list[tuple[str, bool]] = []
            for m in messages:
                parts += [(f"<|im_start|>{m.role}\n", True), (m.content, False)]
                parts.append(("<|im_end|>\n", True))
            if add_generation_prompt:
                parts.append(("<|im_start|>assistant\n", True))
            return parts
        if self is ChatFormat.LLAMA3:
            parts = [("<|begin_of_text|>", True)]
            for m in messages:
                parts.append((f"<|start_header_id|>{m.role}<|end_header_id|>\n\n", True))
                parts += [(m.content, False), ("<|eot_id|>", True)]
            if add_generation_prompt:
                parts.append(("<|start_header_id|>assistant<|end_header_id|>\n\n", True))
            return parts
        return _render_gemma(messages, add_generation_prompt)


def _render_gemma(
    messages: Sequence[ChatMessage], add_generation_prompt: bool
) -> list[tuple[str, bool]]:
    # Gemma has no system role: its template prepends the system text to the first user turn.
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    parts = [("<bos>", True)]
    for m in (m for m in messages if m.role != "system"):
        content = m.content
        if system and m.role == "user":
            content, system = f"{system}\n\n{content}", ""
        role = "model" if m.role == "assistant" else "user"
        parts += [(f"<start_of_turn>{role}\n", True), (content, False)]
        parts.append(("<end_of_turn>\n", True))
    if add_generation_prompt:
        parts.append(("<start_of_turn>model\n", True))
    return parts


_STOPS: dict[ChatFormat, tuple[str, ...]] = {
    ChatFormat.CHATML: ("<|im_end|>", "<|im_start|>"),
    ChatFormat.LLAMA3: ("<|eot_id|>", "<|start_header_id|>"),
    ChatFormat.GEMMA: ("<end_of_turn>", "<start_of_turn>"),
}
_MARKERS: tuple[tuple[str, ChatFormat], ...] = (
    ("<|im_start|>", ChatFormat.CHATML),
    ("<|start_header_id|>", ChatFormat.LLAMA3),
    ("<start_of_turn>", ChatFormat.GEMMA),
)
