"""`mythic chat`: talk to an NPC in the terminal, embedded, through a server, or by voice."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from mythic._errors import MythicError
from mythic.cli._console import err, guard, load_config, out
from mythic.cli._options import ConfigOption


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
    from mythic.dialogue import Conversation, PlayerInputError
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
        conversation = guard(lambda: Conversation(loaded, npc, engine, settings.chat))
        interactive = say is None
        if interactive:
            err.print(
                f"You are talking to {persona.name} ({persona.archetype}). "
                "Type a line and press Enter; Ctrl-D or /quit to leave."
            )
        lines = iter(say) if say is not None else _read_lines()
        for line in lines:
            if line.strip() in {"/quit", "/exit"}:
                break
            if not interactive:
                out.print(f"> {line}")
            out.print(f"{persona.name}: ", end="")
            try:
                for piece in conversation.reply(line):
                    out.print(piece, end="", markup=False)
                    out.file.flush()
            except PlayerInputError as exc:
                out.print()
                err.print(str(exc), style="yellow")
                continue
            except KeyboardInterrupt:
                # Ctrl-C cuts the NPC off (what it said so far is kept); Ctrl-D leaves.
                out.print(" [cut off]", markup=False)
                continue
            out.print()
    finally:
        engine.close()


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
