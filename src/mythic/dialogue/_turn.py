"""A turn: the reply to a player's line, streamed through the line filter, its decision
(intent and tool), the tool call and its voiced result, and what the session keeps of it.

The reply streams from the dialogue engine (silver) while the decision runs on the intent
engine (gold). Reply deltas go to the session as they come and through the phrase buffer for
speech; a tool call goes out after the reply, waits for the game's `Ack`, and its result is
voiced in a short follow-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import time
import zlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from mythic._errors import MythicError
from mythic.config import ChatSettings
from mythic.contracts import LLMStreamDelta
from mythic.dialogue._character import Character
from mythic.dialogue._decision import Decider, Decision
from mythic.dialogue._events import PlayerLine, ambient_note
from mythic.dialogue._intents import Intents, error_message
from mythic.dialogue._line_filter import LineFilter
from mythic.dialogue._naturalness import Finding, greeting_lead, greets, opening, sentences
from mythic.dialogue._phrases import PhraseBuffer, sentences_end
from mythic.dialogue._prefill import Prefill
from mythic.dialogue._refusals import AMBIENT_REPEAT, deflection, reminder, unsafe_deflection
from mythic.dialogue._session import INTERRUPTED_NOTE, Session, heard_lines, replies_in
from mythic.dialogue._stage import Stage, ToolOutcome
from mythic.dialogue._states import DialogueState
from mythic.dialogue._window import PromptWindow, TailAgain
from mythic.engine import ChatMessage, EngineError, RequestError, Sampling
from mythic.memory import Fact
from mythic.safety import ReplyGuard, Verdict

log = logging.getLogger(__name__)

_AMBIENT_MIN_WORDS = 3
"""Among NPCs talking, a line shorter than this is not said: "Yes." and "Thank you." said
back and forth are a loop, not a conversation (the line passes to the next NPC)."""

Finish = Literal["stop", "length", "tool_call", "cutoff", "error"]

VOICE_RESULT = ChatMessage(
    "system", "Tell the player, in one short sentence and in character, what you just did."
)
"""Asked after a tool's result when the model voices it (`dialogue.tool_voice: model`)."""


@dataclass(slots=True)
class TurnRecord:
    """What a finished turn did, for `GET /v1/npcs/{id}` and the tests."""

    session_id: str
    turn_id: str
    text: str
    finish: Finish
    intent: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    first_phrase_tokens: int | None = None
    """Tokens the model had generated when the reply's first phrase went to speech, counting
    those of tries the line filter caught."""
    caught: list[str] = field(default_factory=list)
    """What the line filter caught in this turn's tries (`Finding.kind`s), in order."""
    ambient: bool = False
    """The line was a scene's ambient line (NPCs among themselves)."""
    safety: list[str] = field(default_factory=list)
    """Content-policy violations of the turn, as `where:category` (`player:injection`,
    `reply:hate`, `tool:tool`): each deflected or refused."""


def chat_sampling(settings: ChatSettings) -> Sampling:
    """The sampling of an NPC's replies."""
    return Sampling(
        max_tokens=settings.max_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        repeat_penalty=settings.repeat_penalty,
        dry_multiplier=settings.dry_multiplier,
        dry_base=settings.dry_base,
        dry_allowed_length=settings.dry_allowed_length,
        dry_penalty_last_n=settings.dry_penalty_last_n,
        dry_sequence_breakers=tuple(settings.dry_sequence_breakers),
        dry_scope=settings.dry_scope,
    )


class Turns:
    """Plays the turns of one NPC, one at a time (its actor starts and stops them)."""

    def __init__(
        self,
        stage: Stage,
        character: Character,
        sessions: dict[str, Session],
        window: PromptWindow,
        prefill: Prefill,
        decider: Decider,
        intents: Intents,
        enter: Callable[[DialogueState], None],
    ) -> None:
        self.stage = stage
        self.character = character
        self.sessions = sessions
        self.window = window
        self.prefill = prefill
        self.decider = decider
        self.intents = intents
        self._enter = enter
        self.last: TurnRecord | None = None
        """The last turn that ended."""
        self.heard: dict[str, str] = {}
        """Of a turn being stopped by a barge-in: the words the player heard of its reply."""

    def mark_interrupted(self, session_id: str, turn_id: str, heard: str | None = None) -> None:
        """The player cut in while the reply to `turn_id`, all written, was being spoken:
        its history says so, and keeps only the words the player `heard` (when known)."""
        last = self.last
        session = self.sessions.get(session_id)
        history = session.history if session is not None else None
        if (
            last is None
            or (last.session_id, last.turn_id) != (session_id, turn_id)
            or last.finish == "cutoff"
            or not history
            or history[-1].role != "assistant"
            or history[-1].content.endswith(INTERRUPTED_NOTE)
        ):
            return
        said = history[-1].content if heard is None else heard.strip()
        history[-1] = ChatMessage("assistant", f"{said} {INTERRUPTED_NOTE}".strip())
        self.last = dataclasses.replace(last, finish="cutoff")
        self.stage.stats.barge_ins += 1

    def unanswered(self, line: PlayerLine) -> None:
        """`line` was dropped before its turn began (a barge-in or a cutoff came first): it
        still gets its one final delta, `cutoff`, so no caller waits for a turn that will
        never run. Nothing was said, so nothing enters the history."""
        out = TurnOutput(self, line)
        out.reason = "cutoff"
        out.close()
        self.stage.stats.turn_finished("cutoff")
        line.settle("", "cutoff")

    async def run(self, line: PlayerLine) -> None:
        """Play the turn answering `line`; cancelled, it stops within one engine step and
        what was said stays in the history."""
        stage, session_id = self.stage, line.session_id
        settings = stage.settings
        self._enter(DialogueState.LISTENING)
        session = self.sessions.setdefault(session_id, Session())
        session.spoken_to = True
        history = session.history
        refused = self._check_line(line)
        if refused is None or refused.ok:
            if refused is not None and refused.redacted:
                # Personal data never reaches the model, the history, memory or a log.
                line = dataclasses.replace(line, text=refused.text)
            refused = None
        out = TurnOutput(self, line)
        if refused is not None:
            await self._refuse_line(out, refused)
            return
        memory = stage.memory if line.player_id is not None else None
        self.character.reread_if_reloaded()
        user = ChatMessage("user", line.said)
        decision_task: asyncio.Task[Decision | None] | None = None
        speaking = False
        try:
            self._enter(DialogueState.THINKING)
            if memory is not None and line.player_id is not None:
                await self.window.recall(session_id, line.player_id)
            spoken = line.spoken and settings.dialogue.prefill_while_speaking
            out.context, context = await self.prefill.line_context(
                session_id, line.text, spoken=spoken
            )
            out.answer = context.answer_note()
            if line.ambient and line.speaker is not None:
                out.before = (ChatMessage("system", ambient_note(line.speaker)),)

            async def tail_again() -> list[ChatMessage]:
                again = await self.window.context(session_id, line.text)
                cut = self.window.spoken_cut(again) if spoken else again
                out.context = self.window.record_context(cut.messages)
                return [*out.context, *out.before, user, *out.answer]

            # An ambient line (NPCs among themselves) decides nothing: its gold decision
            # would run before every player's line.
            decide = settings.dialogue.decide and not line.ambient
            reply = self._checked_reply(out, history, user, tail_again)
            async with contextlib.aclosing(reply):
                async for text in reply:
                    if not speaking:
                        # The speaker slots are the players': an ambient line takes none
                        # (it would keep a player's reply thinking).
                        if not line.ambient:
                            await stage.speakers.acquire()
                        speaking = True
                        self._enter(DialogueState.SPEAKING)
                    out.say(text)
                    if decide and decision_task is None and out.phrases:
                        # The decision shares the engine with the reply and is needed only
                        # when the reply ends: it starts once the first phrase has gone to
                        # speech, so it delays neither the first token nor the first audio
                        # (the next phrase is decoded while that one is spoken).
                        decision_task = asyncio.create_task(self.decider.decide(line))
                    if out.capped:  # a spoken reply's last sentence: stop the model
                        out.reason = "stop"
                        stage.stats.capped += 1
                        break
                    if out.blocked:  # the policy blocked a phrase: the deflection ends it
                        out.reason = "stop"
                        break
            if line.hold is not None and not await line.hold.wait():
                raise asyncio.CancelledError  # a preemptive reply not confirmed: dropped
            out.flush_phrases()  # the reply's last words are spoken while the decision ends
            if speaking:  # the decision and a tool's round trip are not speech: free the slot
                if not line.ambient:
                    stage.speakers.release()
                speaking = False
            if decide and decision_task is None:
                decision_task = asyncio.create_task(self.decider.decide(line))
            decision = await decision_task if decision_task else None
            decision_task = None
            if decision is not None:
                out.intent = decision.intent
                session.intent = decision.intent
                self.intents.push(session_id, decision.intent)
            if decision is not None and decision.tool is not None and line.tools:
                if out.blocked:
                    pass  # a reply the policy stopped acts on nothing it said
                elif self._tool_allowed(out, *decision.tool):
                    await self._call_tool(out, history, user, decision.tool)
        except asyncio.CancelledError:
            out.reason = "cutoff"
            self._enter(DialogueState.BARGE_IN)
            raise
        except (RequestError, EngineError) as exc:
            out.reason = "error"
            failed = error_message(exc, turn_id=line.turn_id)
            out.emit(lambda: stage.send(session_id, failed))
        finally:
            if decision_task is not None:
                decision_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, MythicError):
                    await decision_task
            out.close()
            # A preemptive reply not confirmed left nothing: no history, memory or record.
            if line.hold is None or not line.hold.discarded:
                self._keep(out, session, user, memory is not None)
            else:
                line.settle("", "cancelled")
            if speaking and not line.ambient:
                stage.speakers.release()
            self._enter(DialogueState.IDLE)

    def _check_line(self, line: PlayerLine) -> Verdict | None:
        """The content check of a player's line (None: no policy, or not a player's line:
        another NPC's words were checked as its reply)."""
        guard = self.character.guard
        if guard is None or line.speaker is not None or line.ambient:
            return None
        return guard.check_player(line.text)

    def violation(self, out: TurnOutput, where: str, verdict: Verdict) -> None:
        """Count and log a violation with the turn's ids (never its words: the detail names
        what was found, cut short)."""
        line = out.line
        category = verdict.category or "unknown"
        self.stage.stats.safety[(where, category)] += 1
        out.safety.append(f"{where}:{category}")
        log.warning(
            "safety: %s %s blocked (npc %s, session %s, turn %s): %s",
            where,
            category,
            self.character.npc_id,
            line.session_id,
            line.turn_id,
            verdict.detail[:120],
        )

    async def _refuse_line(self, out: TurnOutput, verdict: Verdict) -> None:
        """A player's line the policy blocks: the NPC deflects in character without the model,
        and nothing of the exchange is kept (history, memory) but the record of the turn."""
        line = out.line
        self.violation(out, "player", verdict)
        try:
            if line.hold is not None and not await line.hold.wait():
                out.reason = "cutoff"  # a preemptive line not confirmed: nothing is said
                return
            self._enter(DialogueState.THINKING)
            self._enter(DialogueState.SPEAKING)
            out.say_checked(out.deflection(going_on=False))
            out.reason = "stop"
        finally:
            out.close()
            said = out.text().strip()
            self.last = TurnRecord(
                line.session_id, line.turn_id, said, out.reason, safety=out.safety
            )
            self.stage.stats.turn_finished(out.reason)
            line.settle(said, out.reason)
            self._enter(DialogueState.IDLE)

    def _tool_allowed(self, out: TurnOutput, name: str, args: dict[str, Any]) -> bool:
        """Whether the policy lets the NPC call `name` with `args`; a refused call is counted,
        logged and recorded, and never leaves the server."""
        guard = self.character.guard
        if guard is None:
            return True
        verdict = guard.check_tool(name, args)
        if verdict.ok:
            return True
        self.violation(out, "tool", verdict)
        out.tool_calls.append({"name": name, "args": args, "status": "refused"})
        return False

    def _keep(self, out: TurnOutput, session: Session, user: ChatMessage, remember: bool) -> None:
        """What the session (history), memory and `last` keep of a finished turn."""
        stage, line, session_id = self.stage, out.line, out.line.session_id
        memory = stage.memory if remember else None
        history = session.history
        said = out.text().strip()
        heard = self.heard.pop(line.turn_id, None)
        if out.reason == "cutoff" and heard is not None:
            said = heard.strip()  # what the player heard before cutting in, no more
        if memory is not None and line.player_id is not None:
            npc_id = self.character.npc_id
            if line.speaker is None:
                memory.record_turn(npc_id, line.player_id, session_id, "player", line.text)
            else:  # another NPC of a scene spoke to this one
                memory.record_event(
                    npc_id, line.player_id, session_id, f"Heard nearby: {line.speaker}: {line.text}"
                )
            if said:
                memory.record_turn(npc_id, line.player_id, session_id, "npc", said)
        # After a barge-in the next turn knows: the model sees where it was stopped.
        kept = f"{said} {INTERRUPTED_NOTE}" if out.reason == "cutoff" and said else said
        if out.reason == "cutoff" and heard is not None and not said and out.text().strip():
            kept = INTERRUPTED_NOTE  # cut off before a whole word of it was heard
        if out.history_open:
            history.append(ChatMessage("assistant", kept or "..."))
        elif kept:  # the context told stays with its exchange: it is not told again
            history += [*out.context, *out.before, user, ChatMessage("assistant", kept)]
        session.trim(stage.settings.chat.history_turns)
        self.last = TurnRecord(
            session_id,
            line.turn_id,
            said,
            out.reason,
            out.intent,
            out.tool_calls,
            out.first_phrase_tokens,
            out.caught,
            line.ambient,
            out.safety,
        )
        stage.stats.turn_finished(out.reason)
        line.settle(said, out.reason)

    async def _checked_reply(
        self,
        out: TurnOutput,
        history: list[ChatMessage],
        user: ChatMessage,
        tail_again: TailAgain,
    ) -> AsyncGenerator[str, None]:
        """Stream the reply to `user` through the line filter (`dialogue.line_filter`): each
        clause leaves once checked. A reply caught is generated again, sampled, with a
        reminder of what went wrong after the player's line (not kept in the history), up to
        `dialogue.regenerate_tries` times, then the NPC refuses in a short line. One caught
        after a whole sentence left ends there; one caught mid-sentence is generated again
        from the words already said (they are the new try's start), so the player never
        hears half a sentence ("I'm sorry,"). A greeting's reply begins with a catchphrase
        (`_lead`), checked with the model's first words and sent with them."""
        dialogue = self.stage.settings.dialogue
        lead = self._lead(out.line, history)
        if not dialogue.line_filter:
            reply = self.generate(
                out,
                history,
                *out.context,
                *out.before,
                user,
                *out.answer,
                tail_again=tail_again,
                lead=lead,
            )
            async with contextlib.aclosing(reply):
                async for text in reply:
                    yield lead + text  # the lead leaves with the model's first words
                    lead = ""
            return
        sampling = chat_sampling(self.stage.settings.chat)
        extra: tuple[ChatMessage, ...] = ()
        finding: Finding | None = None
        given = ""  # what the player has been sent of this reply

        def fresh(released: str) -> str:
            """What the filter has released that was not sent yet (the try began with it)."""
            if released.startswith(given):
                return released[len(given) :]
            return released[len(given.rstrip()) :]

        for attempt in range(dialogue.regenerate_tries + 1):
            check = self._line_filter(
                history,
                user.content,
                out.line.text if out.line.speaker else None,
                ambient=out.line.ambient,
            )
            out.reason = "stop"

            async def again(note: tuple[ChatMessage, ...] = extra) -> list[ChatMessage]:
                return [*(await tail_again()), *note]

            reply = self.generate(
                out,
                history,
                *out.context,
                *out.before,
                user,
                *out.answer,
                *extra,
                tail_again=again,
                sampling=sampling,
                lead=lead,
            )
            # The lead is checked with the model's first words and leaves with them: a try
            # caught right after it is generated again rather than cut to "Sugar,".
            held = lead
            finding = None
            async with contextlib.aclosing(reply):
                async for text in reply:
                    _, finding = check.push(held + text)
                    held = ""
                    if len(check.released.rstrip()) > len(lead) and fresh(check.released):
                        yield fresh(check.released)
                        given = check.released
                    if finding is not None:
                        break
            if finding is None and held:  # the model said nothing after the lead
                _, finding = check.push(held)
            if finding is None:
                _, finding = check.finish()
            if finding is None:
                if fresh(check.released):
                    yield fresh(check.released)
                return
            self.stage.stats.caught[finding.kind] += 1
            out.caught.append(finding.kind)
            ended = re.search(r"[.!?…][\"')\]]*\s*$", given) is not None
            log.info(
                "%s: reply caught on try %d (%s: %r)%s",
                self.character.npc_id,
                attempt + 1,
                finding.kind,
                finding.detail,
                ", ended there" if ended else (", going on from what was said" if given else ""),
            )
            if ended:
                out.reason = "stop"
                return
            if given:
                lead = given.rstrip()
            told = (
                AMBIENT_REPEAT
                if out.line.ambient and finding.kind == "repeat"
                else reminder(finding.kind, self.character.short_name)
            )
            extra = (ChatMessage("system", told),)
            sampling = dataclasses.replace(
                sampling,
                temperature=max(sampling.temperature, 0.8),
                seed=zlib.crc32(f"{user.content}\0{attempt}".encode()),
                # A repeat comes back at any temperature (the conversation so far leads the
                # model into it): the next try pays a steeper price for every repeated token.
                dry_multiplier=(
                    max(4.0, sampling.dry_multiplier)
                    if finding.kind == "repeat"
                    else sampling.dry_multiplier
                ),
            )
        assert finding is not None
        out.reason = "stop"
        if out.line.ambient:
            # Among themselves, a refusal ("Come again? Speak plainly.") is no line to a
            # fellow NPC: the line ends with what was said (nothing: the exchange ends).
            return
        # Every try caught: the NPC refuses, in words not yet said in this conversation:
        # finishing the sentence whose first clause went out ("I am Marla," "and there it
        # ends."), else breaking off what it had begun to say.
        said = [s for text in (*replies_in(history), given) for s in sentences(text)]
        going_on = re.search(r"[,;:\u2014\u2013]\s*$", given) is not None
        refusal = deflection(finding.kind, out.line.turn_id, said, going_on=going_on)
        if going_on:
            yield ("" if given.endswith(" ") else " ") + refusal
        else:
            yield ("— " if given else "") + refusal

    def _line_filter(
        self,
        history: list[ChatMessage],
        line: str,
        speaker_line: str | None = None,
        *,
        ambient: bool = False,
    ) -> LineFilter:
        """The checks of one reply in a conversation whose messages so far are `history`;
        `speaker_line`: the words of another character the reply answers (a scene's);
        `ambient`: among NPCs talking, no sentence of any length is said again, sentences
        leave whole and a line of two words is not said ("Yes, thank you." is)."""
        character = self.character
        said = replies_in(history)
        heard = [m.content for m in history if m.role == "user"]
        # What others of a scene said in its hearing is not its own line to say again: an
        # NPC answering another says more than the words it was told.
        others = [*heard_lines(history), *([speaker_line] if speaker_line else [])]
        if ambient:  # among NPCs, nor what the player said to it: "Dolly, tell me about ..."
            others += [m.content for m in history if m.role == "user"]
        return LineFilter(
            forms=character.name_forms,
            secrets=character.secrets,
            heard=" ".join([*heard, line]),
            earlier=[s for text in [*said, *others] for s in sentences(text)],
            openings=[opening(text) for text in said],
            instructions=character.instructions,
            plain=character.plain,
            own=character.persona.catchphrases,
            asked=line,
            known=character.known,
            others=character.others,
            repeat_words=1 if ambient else 4,
            whole_sentences=ambient,
            min_words=_AMBIENT_MIN_WORDS if ambient else 0,
            hold_words=self.stage.settings.dialogue.first_phrase_words,
        )

    def _lead(self, line: PlayerLine, history: list[ChatMessage]) -> str:
        """How the reply to `line` begins: a catchphrase not yet said when the line greets
        (`dialogue.greet_with_catchphrase`), else "" (the model begins it)."""
        catchphrases = self.character.persona.catchphrases
        if not (self.stage.settings.dialogue.greet_with_catchphrase and catchphrases):
            return ""
        if not greets(line.text) or not self.stage.router.can_continue("dialogue"):
            return ""  # a remote endpoint without continue_final_message: the model begins
        said = replies_in(history)
        return greeting_lead(catchphrases, said, f"{line.session_id}\0{len(said)}")

    async def generate(
        self,
        out: TurnOutput,
        history: list[ChatMessage],
        *tail: ChatMessage,
        tail_again: TailAgain | None = None,
        sampling: Sampling | None = None,
        lead: str = "",
    ) -> AsyncGenerator[str, None]:
        """Stream a reply to `tail` after `history`, dropping the oldest exchanges while the
        prompt overflows the context (`PromptWindow.open`); the engine's finish reason lands
        in `out.reason`. `sampling`: the chat settings' when None; `lead`: the reply's start,
        which the model continues (not streamed here).

        Raises:
            ContextOverflowError: even the persona and `tail` alone do not fit.
        """
        stats = self.stage.stats
        stream = await self.window.open(
            out.line.session_id,
            tail,
            sampling or chat_sampling(self.stage.settings.chat),
            "tool_dialogue" if out.tool_calls else "dialogue",
            history=history,
            canned=self.character.canned(out.line.turn_id),
            tail_again=tail_again,
            lead=lead,
            priority=out.line.priority,
        )
        async with stream:
            async for delta in stream:
                if delta.text:
                    out.model_tokens += 1
                    yield delta.text
                if delta.finish_reason == "length":
                    out.reason = "length"
                if delta.prompt_tokens:
                    stats.reply_prompt_tokens += delta.prompt_tokens
                    stats.reply_cached_tokens += delta.cached_tokens

    async def _call_tool(
        self,
        out: TurnOutput,
        history: list[ChatMessage],
        user: ChatMessage,
        tool: tuple[str, dict[str, Any]],
    ) -> None:
        """Send the call, wait for the game's Ack, then voice the result in a follow-up. An
        external tool (`server.tool`, an MCP server's) Mythic calls itself, after approval
        when it writes."""
        name, args = tool
        stage, npc_id = self.stage, self.character.npc_id
        out.end_segment("tool_call")
        self._enter(DialogueState.THINKING)
        external = stage.external is not None and "." in name
        if external:
            outcome = self._checked_result(
                out, name, await self._call_external(out.line, name, args)
            )
        else:
            outcome = await stage.call_tool(
                out.line.session_id, npc_id, out.line.turn_id, name, args
            )
        out.tool_calls.append({"name": name, "args": args, "status": outcome.status})
        said = out.text().strip()
        note = _tool_note(name, args, outcome)
        self._remember_tool(out.line, name, args, outcome, note)
        # The follow-up joins the history as the NPC's next words (in the turn's `finally`).
        exchange = [
            *out.context,
            user,
            ChatMessage("assistant", said or "..."),
            ChatMessage("system", note),
        ]
        history += exchange
        out.restart()
        async with stage.speakers:  # the follow-up is speech again: one of the slots
            self._enter(DialogueState.SPEAKING)
            # What an external tool answered only the model can say; a refusal a line can.
            template = stage.settings.dialogue.tool_voice == "template"
            if template and (not external or outcome.status != "ok"):
                line = self._voice_template(name, args, outcome)
                if line:
                    out.say(line)
                return
            voice = VOICE_EXTERNAL if external else VOICE_RESULT
            history_before = history[: -len(exchange)]
            async for text in self.generate(out, history_before, *exchange, voice):
                out.say(text)

    def _checked_result(self, out: TurnOutput, name: str, outcome: ToolOutcome) -> ToolOutcome:
        """An external tool's answer goes into the prompt: it is untrusted text, checked as a
        tool's (instructions, hate speech, personal data ...); one the policy blocks is
        withheld, and the NPC answers without it."""
        guard = self.character.guard
        if guard is None or outcome.status != "ok" or not outcome.result:
            return outcome
        verdict = guard.check(json.dumps(outcome.result, ensure_ascii=False), "tool")
        if verdict.ok:
            return outcome
        self.violation(out, "tool_result", verdict)
        return ToolOutcome("error", None, f"{name}'s answer was withheld by the content policy")

    async def _call_external(
        self, line: PlayerLine, name: str, args: dict[str, Any]
    ) -> ToolOutcome:
        """Call an external tool for this NPC: refused before it leaves when not allowed or
        its arguments fail the schema; a write tool first approved (`mcp.approver`); a read
        tool's cached result reused. Never raises for the tool's failure."""
        stage, npc_id = self.stage, self.character.npc_id
        external = stage.external
        assert external is not None
        stats = stage.stats.tool_calls
        refused = external.refusal(npc_id, name, args)
        if refused is not None:
            stats[f"mcp_{refused.status}"] += 1
            return ToolOutcome(refused.status, None, refused.message)
        if external.writes(name):
            denied = await self._approval(line, name, args)
            if denied is not None:
                stats["mcp_rejected"] += 1
                return denied
        else:
            hit = external.cached(npc_id, name, args)
            if hit is not None:
                stats["mcp_cached"] += 1
                return ToolOutcome("ok", hit.result)
        done = await external.call(npc_id, name, args)
        stats[f"mcp_{done.status}"] += 1
        return ToolOutcome(done.status, done.result, done.message)

    async def _approval(
        self, line: PlayerLine, name: str, args: dict[str, Any]
    ) -> ToolOutcome | None:
        """None when a write tool's call is approved (`mcp.approver`: `game` asks the game
        with a `ToolCall` that `needs_approval`, its `Ack` `ok` approves); else the refusal."""
        stage = self.stage
        approver = stage.settings.mcp.approver
        if approver == "allow":
            return None
        if approver == "game":
            answer = await stage.call_tool(
                line.session_id,
                self.character.npc_id,
                line.turn_id,
                name,
                args,
                needs_approval=True,
            )
            stage.stats.tool_calls[f"approval_{answer.status}"] += 1
            if answer.status == "ok":
                return None
        return ToolOutcome("rejected", message="not approved")

    def _remember_tool(
        self,
        line: PlayerLine,
        name: str,
        args: dict[str, Any],
        outcome: ToolOutcome,
        note: str,
    ) -> None:
        """Archive a tool call; a gift the game confirmed becomes a salient fact."""
        memory = self.stage.memory
        if memory is None or line.player_id is None:
            return
        fact = None
        if name == "give_item" and outcome.status == "ok":
            gift = f"{self.character.short_name} gave the player {args.get('item')}"
            fact = Fact(gift, 6, "gift")
        memory.record_event(
            self.character.npc_id,
            line.player_id,
            line.session_id,
            note,
            data={"tool": name, "args": args, "status": outcome.status},
            fact=fact,
        )

    def _voice_template(self, name: str, args: dict[str, Any], outcome: ToolOutcome) -> str:
        """What the NPC says about a tool call it made, without asking the model."""
        if outcome.status == "rejected" and "." in name:
            return "No, I can't do that right now."
        if outcome.status != "ok":
            return "Hm. That did not work."
        place = self.character.place_name
        match name:
            case "set_waypoint":
                return f"There: follow the mark to {place(args.get('target'))}."
            case "set_marker":
                return f"I've marked {place(args.get('location'))} on your map."
            case "give_item":
                return f"Here, take this: {args.get('item')}."
            case "open_dialog":
                return "Here, have a look."
            case _:
                return ""


class TurnOutput:
    """The deltas of one turn on the wire: numbered without gaps, phrase-buffered for speech,
    ended by exactly one final delta per segment."""

    def __init__(self, turns: Turns, line: PlayerLine) -> None:
        self.stage = turns.stage
        self.npc_id = turns.character.npc_id
        self.line = line
        self.seq = 0
        self.reason: Finish = "stop"
        self.intent: str | None = None
        self.tool_calls: list[dict[str, Any]] = []
        self.history_open = False
        """The exchange and tool note are in the history; only the follow-up is missing."""
        self.context: list[ChatMessage] = []
        """The turn's context message (lore, scene), sent just before the line."""
        self.answer: tuple[ChatMessage, ...] = ()
        self.before: tuple[ChatMessage, ...] = ()
        """Told just before the line: who says an ambient line to the NPC (`ambient_note`)."""
        """The line answering the player's question, told after it
        (`LineContext.answer_note`); never kept in the history."""
        self._pieces: list[str] = []
        self._segment_open = False
        self._closed = False
        dialogue = self.stage.settings.dialogue
        self._phrases = PhraseBuffer(
            min_s=dialogue.phrase_min_s,
            max_s=dialogue.phrase_max_s,
            first_words=dialogue.first_phrase_words,
        )
        self._max_sentences = dialogue.spoken_max_sentences if line.spoken else 0
        self.phrases = 0
        """Phrases of the reply given to speech (`Stage.phrase`, where the session has
        voice) so far."""
        self.capped = False
        """The reply has said its `spoken_max_sentences`: the turn stops generating."""
        self.model_tokens = 0
        """Text deltas the model has streamed for this turn (every try)."""
        self.first_phrase_tokens: int | None = None
        self.caught: list[str] = []
        self.safety: list[str] = []
        """The turn's violations (`TurnRecord.safety`)."""
        self._turns = turns
        guard = turns.character.guard
        self._guard = ReplyGuard(guard, self.deflection) if guard is not None else None
        self.blocked = False
        """The policy blocked a phrase of the reply: its deflection was said in its place, and
        the reply ends there."""
        self._held: list[Callable[[], None]] | None = None
        """While a preemptive reply is held (`PlayerLine.hold`): what it would have sent."""
        if line.hold is not None and line.hold.held:
            self._held = []
            line.hold.on_release(self._released)

    def text(self) -> str:
        return "".join(self._pieces)

    def emit(self, action: Callable[[], None]) -> None:
        """Send now, or when the preemptive reply is confirmed (dropped if it never is)."""
        if self._held is None:
            action()
        else:
            self._held.append(action)

    def _released(self) -> None:
        held, self._held = self._held or [], None
        for action in held:
            action()

    def _delta(self, text: str, *, final: bool = False, reason: Finish | None = None) -> None:
        stage, line = self.stage, self.line
        delta = LLMStreamDelta(
            npc_id=self.npc_id,
            session_id=line.session_id,
            turn_id=line.turn_id,
            seq=self.seq,
            delta=text,
            final=final,
            finish_reason=reason,
        )
        first = self.seq == 0 and not final
        self.seq += 1

        def send() -> None:
            if first:
                stage.stats.first_token(time.perf_counter() - line.received_at)
                stage.first_token(line.session_id, self.npc_id, line.turn_id)
            stage.send(line.session_id, delta)

        self.emit(send)

    def deflection(self, going_on: bool) -> str:
        """The NPC's line in place of a blocked phrase, not yet said in the conversation."""
        turns, line = self._turns, self.line
        session = turns.sessions.get(line.session_id)
        said = [
            s
            for text in (*replies_in(session.history if session else []), self.text())
            for s in sentences(text)
        ]
        own = turns.character.guard.policy.deflections if turns.character.guard else ()
        return unsafe_deflection(own, line.turn_id, said, going_on=going_on)

    def say(self, text: str) -> None:
        """Say more of the reply: held to the end of its phrase and checked against the
        NPC's content policy first (`mythic.safety.ReplyGuard`); a blocked phrase is said as
        the NPC's deflection, and the turn stops the model (`blocked`)."""
        if self._guard is None:
            self.say_checked(text)
            return
        text = self._guard.push(text)
        self._note_block()
        if text:
            self.say_checked(text)

    def _note_block(self) -> None:
        guard = self._guard
        if guard is not None and guard.blocked is not None and not self.blocked:
            self.blocked = True
            self._turns.violation(self, "reply", guard.blocked)

    def say_checked(self, text: str) -> None:
        """Say `text` as it is (checked already, or the NPC's own refusal)."""
        if self._max_sentences:
            said = "".join(self._pieces)
            end = sentences_end(said + text, self._max_sentences)
            if end is not None:
                self.capped = True
                text = text[: max(end - len(said), 0)]
                if not text:
                    return
        self._segment_open = True
        self._pieces.append(text)
        self._delta(text)
        for phrase in self._phrases.push(text, time.perf_counter()):
            self._phrase(phrase)

    def _phrase(self, text: str) -> None:
        if not self.phrases:
            self.first_phrase_tokens = self.model_tokens
        self.phrases += 1
        line = self.line
        self.emit(lambda: self.stage.phrase(line.session_id, self.npc_id, line.turn_id, text))

    def flush_phrases(self) -> None:
        """Check the words the guard holds and send what the phrase buffer holds to speech
        (the reply has ended)."""
        if self._guard is not None and self.reason != "cutoff":  # held words were never sent
            held = self._guard.finish()
            self._note_block()
            if held:
                self.say_checked(held)
        rest = self._phrases.flush()
        if rest:
            self._phrase(rest)

    def end_segment(self, reason: Finish) -> None:
        self.flush_phrases()
        self._delta("", final=True, reason=reason)
        self._segment_open = False

    def restart(self) -> None:
        """A follow-up segment of the same turn starts (after a tool call)."""
        self._pieces = []
        self._segment_open = True
        self.history_open = True
        self.reason = "stop"

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._segment_open or self.seq == 0 or self.reason in ("cutoff", "error"):
                self.end_segment(self.reason)
            line, reason = self.line, self.reason
            self.emit(
                lambda: self.stage.reply_done(line.session_id, self.npc_id, line.turn_id, reason)
            )


def _tool_note(name: str, args: dict[str, Any], outcome: ToolOutcome) -> str:
    """The game's answer as a fact for the history: no instructions in it, which the model
    would read back on a later turn."""
    described = json.dumps(args, ensure_ascii=False)
    result = json.dumps(outcome.result, ensure_ascii=False) if outcome.result else ""
    why = f" ({outcome.message})" if outcome.message else ""
    return (
        f"Game event: {name} {described} -> {outcome.status}{why}{' ' + result if result else ''}"
    )


VOICE_EXTERNAL = ChatMessage(
    "system",
    "Tell the player, in one short sentence and in character, what the game event above "
    "tells; if it failed or was refused, say you cannot do it now.",
)
"""Asked after an external (MCP) tool's result: only the model can say what it answered."""
