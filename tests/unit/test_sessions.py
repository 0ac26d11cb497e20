"""The gateway's session registry: opening, resuming, expiry, and outbox limits."""

from __future__ import annotations

import pytest

from mythic.contracts import Error
from mythic.server import Session, SessionError, Sessions

pytestmark = pytest.mark.unit


def _note(i: int) -> Error:
    return Error(code="note", message=str(i))


async def test_a_session_resumes_only_with_its_token() -> None:
    sessions = Sessions(max_sessions=4, resume_ttl_s=60, outbox_size=8)
    session = sessions.open("alice")
    assert sessions.resume(session.id, session.resume_token) is session
    for session_id, token in ((session.id, "wrong"), ("s-none", session.resume_token)):
        with pytest.raises(SessionError) as caught:
            sessions.resume(session_id, token)
        assert caught.value.code == "unknown_session"


async def test_the_session_limit_is_a_retryable_error() -> None:
    sessions = Sessions(max_sessions=2, resume_ttl_s=60, outbox_size=8)
    sessions.open(None)
    sessions.open(None)
    with pytest.raises(SessionError) as caught:
        sessions.open(None)
    assert caught.value.code == "too_many_sessions" and caught.value.retryable


async def test_detached_sessions_expire_after_the_resume_window() -> None:
    sessions = Sessions(max_sessions=4, resume_ttl_s=10, outbox_size=8)
    kept, gone, live = sessions.open(None), sessions.open(None), sessions.open(None)
    kept.detached_at, gone.detached_at = 100.0, 80.0
    live.connected = True
    assert sessions.expired(now=95.0) == [gone]
    assert sessions.get(gone.id) is None and sessions.get(kept.id) is kept
    assert sessions.expired(now=111.0) == [kept]
    assert len(sessions) == 1


async def test_a_detached_outbox_keeps_the_newest_messages() -> None:
    session = Session("s-1", None, outbox_size=3)
    for i in range(5):
        session.push(_note(i))
    assert [m.message for m in session.outbox] == ["2", "3", "4"]


async def test_a_connected_client_that_does_not_read_is_cut_off() -> None:
    session = Session("s-1", None, outbox_size=2)
    session.connected = True
    kicked: list[bool] = []
    session.on_overflow = lambda: kicked.append(True)
    for i in range(3):
        session.push(_note(i))
    assert kicked == [True] and session.overflowed
    assert [m.message for m in session.outbox] == ["0", "1"]


async def test_messages_for_a_gone_session_are_dropped() -> None:
    sessions = Sessions(max_sessions=4, resume_ttl_s=60, outbox_size=8)
    gone, kept = sessions.open(None), sessions.open(None)
    sessions.remove(gone.id)
    sessions.send(gone.id, _note(1))  # no error: the NPC finished after its player left
    sessions.send("s-never", _note(2))
    assert not gone.outbox and not gone.ready.is_set()
    assert not kept.outbox and len(sessions) == 1
    assert sessions.get(gone.id) is None and sessions.get("s-never") is None
