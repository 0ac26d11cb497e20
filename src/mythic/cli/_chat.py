"""`mythic chat`: talk to an NPC in the terminal, embedded, through a server, or by voice."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from queue import SimpleQueue
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mythic._errors import MythicError
from mythic.cli._console import err, guard, load_config, out
from mythic.cli._options import ConfigOption

if TYPE_CHECKING:
    from mythic.dialogue import Chat


def chat(
    npc: Annotated[str, typer.Option("--npc", "-n", help="NPC id (file name of its card).")],
    world: Annotated[
        Path | None, typer.Option("--world", "-w", help="World folder (without --server).")
    ] = None,
    server: Annotated[
        str | None,
        typer.Option("--server", "-s", help="Talk through a running server: ws://HOST:PORT/v1/ws"),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="Packaged model name or GGUF path (default: engine.dialogue_model).",
        ),
    ] = None,
    say: Annotated[
        list[str] | None,
        typer.Option(
            "--say",
            help="Say this and print the reply instead of chatting interactively (repeatable).",
        ),
    ] = None,
    voice: Annotated[
        Path | None,
        typer.Option(
            "--voice",
            help="Speak this WAV file to the NPC (streamed at real-time pace) and hear the "
            "reply in audio; without --server, a voice server is started for --world.",
        ),
    ] = None,
    out_wav: Annotated[
        Path, typer.Option("--out", "-o", help="Where --voice writes the NPC's spoken reply.")
    ] = Path("reply.wav"),
    config: ConfigOption = None,
) -> None:
    """Talk to an NPC in the terminal; replies stream as they are generated."""
    if voice is not None:
        guard(lambda: _chat_by_voice(voice, npc, server, world, out_wav))
        return
    if server is not None:
        guard(lambda: _chat_over_server(server, npc, say))
        return
    if world is None:
        err.print("error: give --world (embedded model) or --server URL", style="bold red")
        raise typer.Exit(2)
    from mythic.dialogue import open_chat
    from mythic.engine import Engine
    from mythic.knowledge import load_world

    settings = load_config(config)
    loaded = guard(lambda: load_world(world))
    try:
        persona = loaded.npc(npc)
    except KeyError as exc:
        err.print(f"error: {exc.args[0]}", style="bold red")
        raise typer.Exit(2) from None
    name = model or settings.engine.dialogue_model
    err.print(f"Loading {name} ...")
    engine = guard(lambda: Engine.load(settings.engine, name))
    try:
        played = guard(lambda: _InProcess(open_chat(loaded, npc, settings, engine=engine)))
        try:
            _converse(played, persona.name, persona.archetype, say)
        finally:
            guard(played.close)
    finally:
        engine.close()


def _converse(played: _InProcess, name: str, archetype: str, say: list[str] | None) -> None:
    """The terminal's side of an in-process chat: lines in, the NPC's replies out."""
    from mythic.dialogue import PlayerInputError

    interactive = say is None
    if interactive:
        err.print(
            f"You are talking to {name} ({archetype}). "
            "Type a line and press Enter; Ctrl-D or /quit to leave."
        )
    lines = iter(say) if say is not None else _read_lines()
    for line in lines:
        if line.strip() in {"/quit", "/exit"}:
            break
        if not interactive:
            out.print(f"> {line}")
        try:
            out.print(f"{name}: ", end="")
            out.file.flush()  # the turn has begun: a program reading the pipe sees it now
            played.say(line, _show)
        except PlayerInputError as exc:
            out.print()
            err.print(str(exc), style="yellow")
            continue
        except MythicError as exc:
            # No model could answer this line; the chat goes on.
            out.print()
            err.print(f"error: {exc}", style="bold red")
            continue
        except KeyboardInterrupt:
            # Ctrl-C cuts the NPC off (what it said so far is kept); Ctrl-D leaves.
            out.print(" [cut off]", markup=False)
            continue
        out.print()


def _show(piece: str) -> None:
    out.print(piece, end="", markup=False)
    out.file.flush()


@dataclass(slots=True)
class _Turn:
    """One line said in an in-process chat, and the reply's pieces for the terminal."""

    line: str
    pieces: SimpleQueue[str | BaseException | None] = field(default_factory=SimpleQueue)
    """Reply text, then None (the end) or the error the reply raised."""
    task: asyncio.Task[None] | None = None
    """The reply's task on the chat's loop, once it is created."""


class _InProcess:
    """A chat (`open_chat`) played on an event loop in a thread of its own, so that the
    terminal's main thread reads lines and takes Ctrl-C as a plain program does."""

    def __init__(self, opened: AbstractAsyncContextManager[Chat]) -> None:
        """Open the chat and wait until it is ready.

        Raises:
            MythicError: what opening it raised (an unknown NPC, a model that cannot chat).
        """
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="mythic-chat", daemon=True
        )
        self._thread.start()
        self._ready: Future[Chat] = Future()
        self._closing = asyncio.Event()
        self._ended = asyncio.run_coroutine_threadsafe(self._host(opened), self._loop)
        either: list[Future[Any]] = [self._ready, self._ended]
        concurrent.futures.wait(either, return_when="FIRST_COMPLETED")
        if not self._ready.done():
            self._stop()  # opening failed: `result` raises why
        self._chat = self._ready.result()

    async def _host(self, opened: AbstractAsyncContextManager[Chat]) -> None:
        async with opened as chat:
            self._ready.set_result(chat)
            await self._closing.wait()

    def _relay(self, turn: _Turn) -> None:
        """On the loop: stream the reply to the turn's line into its pieces, ended by None or
        the error the reply raised (also when cut off before it began)."""

        def ended(task: asyncio.Task[None]) -> None:
            turn.pieces.put(None if task.cancelled() else task.exception())

        turn.task = self._loop.create_task(self._stream(turn))
        turn.task.add_done_callback(ended)

    async def _stream(self, turn: _Turn) -> None:
        async for piece in self._chat.say(turn.line):
            turn.pieces.put(piece)

    @staticmethod
    def _cut_off(turn: _Turn) -> None:
        """On the loop: cut the turn off. Its relay was scheduled before this (the loop runs
        callbacks in order), unless Ctrl-C came before it could be: then the turn ends here."""
        if turn.task is not None:
            turn.task.cancel()
        else:
            turn.pieces.put(None)

    def say(self, line: str, show: Callable[[str], None]) -> None:
        """Say `line` and `show` the reply piece by piece, on the calling thread.

        Raises:
            KeyboardInterrupt: Ctrl-C: the NPC was cut off (what it said is kept).
            PlayerInputError: the line cannot be used.
            MythicError: no model could answer.
        """
        turn = _Turn(line)
        try:
            self._loop.call_soon_threadsafe(self._relay, turn)
            while isinstance(piece := turn.pieces.get(), str):
                show(piece)
        except KeyboardInterrupt:
            # Ctrl-C may come at any moment, even before the turn's task exists. Leaving the
            # reply's stream cuts the NPC off; wait until it has stopped, so that the next
            # line's turn never runs beside this one.
            self._loop.call_soon_threadsafe(self._cut_off, turn)
            while isinstance(turn.pieces.get(), str):
                pass
            raise
        if piece is not None:
            raise piece

    def close(self) -> None:
        """End the chat and stop its thread.

        Raises:
            MythicError: what closing raised.
        """
        self._loop.call_soon_threadsafe(self._closing.set)
        self._stop()

    def _stop(self) -> None:
        """Wait for the chat's end, then stop its loop and thread; raise what the chat
        raised."""
        try:
            self._ended.result()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
            self._loop.close()


def _chat_by_voice(
    wav: Path, npc: str, server: str | None, world: Path | None, out_wav: Path
) -> None:
    import asyncio
    import contextlib

    from mythic.cli._sim import spawned_server
    from mythic.cli._voice import load_speech, talk_once

    pcm = load_speech(wav)
    with contextlib.ExitStack() as stack:
        if server is None:
            if world is None:
                raise MythicError("give --world (a voice server is started for it) or --server")
            err.print(f"starting a voice server for {world} ...")
            server = stack.enter_context(spawned_server(world, voice=True, nice=0))
        err.print(f"speaking {len(pcm) / 32000:.1f} s of {wav} to {npc} ...")
        try:
            turn, latency = asyncio.run(
                talk_once(server, npc, pcm, out_wav, lambda line: out.print(line))
            )
        except (OSError, TimeoutError) as exc:
            raise MythicError(f"voice chat with {server} failed: {exc!r}") from exc
    out.print(f"{npc}> {turn.text}")
    if turn.chunks:
        seconds = len(turn.pcm) / 2 / (turn.sample_rate or 22050)
        out.print(f"audio: {seconds:.1f} s in {len(turn.chunks)} chunks -> {out_wav}")
    out.print(
        "latency from the end of speech: "
        + "  ".join(f"{hop} {s * 1000:.0f} ms" for hop, s in latency.items())
    )


def _chat_over_server(url: str, npc: str, say: list[str] | None) -> None:
    """The terminal chat through a server: tool calls are shown and acknowledged as done."""
    import asyncio

    from mythic.client import ClientError, MythicClient, ToolResult
    from mythic.contracts import Error, LLMStreamDelta, ToolCall

    async def tool(call: ToolCall) -> ToolResult:
        out.print(f"\n  [{call.name} {json.dumps(call.args)}]", end="")
        return "ok", None

    async def talk() -> None:
        try:
            client = MythicClient(url, tool_handler=tool, timeout_s=300)
            await client.connect()
        except (OSError, TimeoutError) as exc:
            raise MythicError(f"cannot reach {url}: {exc}", fix="start it: mythic serve") from exc
        try:
            interactive = say is None
            if interactive:
                err.print(f"Talking to {npc} through {url}. Ctrl-D or /quit to leave.")
            for line in iter(say) if say is not None else _read_lines():
                if line.strip() in {"/quit", "/exit"}:
                    break
                if not interactive:
                    out.print(f"> {line}")
                out.print(f"{npc}: ", end="")
                turn = await client.say(npc, line)
                async for event in turn:
                    if isinstance(event, LLMStreamDelta):
                        out.print(event.delta, end="")
                        out.file.flush()
                    elif isinstance(event, Error):
                        err.print(f"\n{event.code}: {event.message}", style="yellow")
                out.print()
        except ClientError as exc:
            raise MythicError(str(exc)) from exc
        finally:
            await client.aclose()

    asyncio.run(talk())


def _read_lines() -> Iterator[str]:
    """Player lines from the terminal (with a prompt) or from piped standard input."""
    tty = sys.stdin.isatty()
    while True:
        try:
            line = input("you> ") if tty else sys.stdin.readline()
        except (EOFError, KeyboardInterrupt):
            out.print()
            return
        if not tty:
            if not line:
                return
            line = line.rstrip("\n")
            out.print(f"you> {line}")
        yield line
