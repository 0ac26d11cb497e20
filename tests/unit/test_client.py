"""The client's own logic, without a server: how a turn's reply text is put together."""

from __future__ import annotations

from typing import Any

import pytest

from mythic.client._client import reply_text
from mythic.contracts import LLMStreamDelta

pytestmark = pytest.mark.unit


def delta(seq: int, text: str, reason: Any = None) -> LLMStreamDelta:
    return LLMStreamDelta(
        npc_id="marla", session_id="s", turn_id="t", seq=seq, delta=text,
        final=reason is not None, finish_reason=reason,
    )  # fmt: skip


def test_a_voiced_tool_result_is_spaced_from_the_reply_before_it() -> None:
    reply = [delta(0, "The mill is north"), delta(1, ".", "tool_call")]
    follow = [delta(2, "There: follow"), delta(3, " the mark."), delta(4, "", "stop")]
    assert reply_text([*reply, *follow]) == "The mill is north. There: follow the mark."
    # Within a segment the deltas join as sent; a space already there is not doubled.
    assert reply_text([delta(0, "Aye,"), delta(1, " friend", "stop")]) == "Aye, friend"
    spaced = [delta(0, "North. ", "tool_call"), delta(1, "There.", "stop")]
    assert reply_text(spaced) == "North. There."
    # An empty delta after the tool call does not lose the gap; an empty reply gets none.
    gap = [delta(0, "North.", "tool_call"), delta(1, ""), delta(2, "There.", "stop")]
    assert reply_text(gap) == "North. There."
    assert reply_text([delta(0, "", "tool_call"), delta(1, "There.", "stop")]) == "There."
