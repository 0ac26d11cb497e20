"""Voice latency: the end of the player's utterance to the NPC's first audio, hop by hop.

20 spoken questions (synthesised by Piper, 16 kHz) are streamed at real-time pace over the
real server's WebSocket, as a microphone would send them, to a `mythic serve --voice` in its
own process: first by 1 speaker (one after the other), then by 4 speakers at once (4
sessions, 4 NPCs, 5 questions each). For each utterance, on the client's clock from the
moment its last speech sample was sent: the final transcript (`asr_final`), the reply's first
token (`first_token`) and its first audio chunk (`first_audio`). The server's own trace of
the same hops (its /metrics) is reported beside. The word error rate is the ASR's on the 20
questions. Ratio: each hop's p50 against the first row (the baseline with --baseline).

The endpoint waits for `trailing_silence_ms` (300 ms) of silence: that wait is inside
`asr_final`. Budget (technical design): first audio <= 800 ms, MVP p95 <= 900, p99 <= 1200.

Work done ahead of the line's end ("ahead" on, the default settings): the reply's prompt
prepared from the partial transcripts while the player speaks
(`dialogue.prefill_while_speaking`), the partials decoded in a 10 s Whisper window
(`speech.partial_window_s`) so that they leave the cores to the model, and the final
transcript started at a pause of `speech.early_final_ms` (128 ms). The final is decoded in
Whisper's whole 30 s window (`speech.asr_window_s`; `--asr-window-s 10` is faster and a little
less accurate). `--baseline` first runs a round with all of it off (partials in the 30 s
window too); the ratio column is then against it.

`--decide off,on` compares rounds without and with the per-line intent and tool decision
(`dialogue.decide`, a gold request on the same model; on by default, `--no-decide` is
`--decide off`): what it costs the first audio.

`--decision-engine before,grammar,steps` compares rounds with the engine settings that make the
decision cheaper (bench/decision.py): `before` has llama.cpp's grammar match the whole
vocabulary at every token (`engine.grammar_check_first: false`) and the decision's steps
evaluate other prompts in full chunks (`engine.prefill_beside_gold` a whole step); `grammar`
checks the greedy pick first; `steps` (the defaults) also keeps a gold step's other prompt
tokens to `prefill_beside_gold`.

`--spoken-lore all,parts` compares, in one run, a spoken line that waits for all its lore
(`all`: `dialogue.prepare_step_tokens` 0 and `more_lore_tokens` 4096) with the default
(`parts`): the lore is evaluated in parts while the player speaks, and the line tells the
parts finished when they stop plus `more_lore_tokens` more.

`--turn silence,smart` compares rounds with turns ended on silence alone and no preemptive
reply (`silence`: `speech.turn_detector: silence`, `dialogue.preempt_spoken_lines: false`)
with the defaults (`smart`: Smart Turn judges each pause, a finished turn ends at once, and the
reply starts from a pause's transcript while the model waits); the ratio is against the first.
Each round's server counts the turn model's verdicts and the preemptive replies kept and
dropped (its /metrics), reported beside.

`--prepare-batch 4096,16` compares rounds with each `dialogue.prepare_batch_tokens`: the
prompt tokens a part of lore prepared while the player speaks evaluates per model step. A
part stopped at the player's pause finishes its step before the reply's prompt can start:
4096 is one step for the whole part (as before the setting), 16 the default.

`--warm off,on` compares rounds without and with the round's NPCs' prompts (persona, and the
decision's) evaluated before the first line (`POST /v1/warmup {"npcs": [...]}`, as a game does
when the player comes near them, and as the server does for its first `server.warm_npcs` NPCs
in the background at start): what a session's first line costs cold. The server's own
background warm-up is off in every round (`MYTHIC_SERVER__WARM_NPCS=0`), so `off` is cold.

The server runs with the environment it is given: `MYTHIC_ENGINE__BACKEND=transformers
MYTHIC_ENGINE__DEVICE=cuda` runs the model on a GPU with the transformers backend, and
`MYTHIC_ENGINE__N_GPU_LAYERS=-1` with a CUDA build of llama.cpp; both are recorded in the
results, and so is `MYTHIC_KNOWLEDGE__RETRIEVAL`.

Writes bench/results/voice.json (or `--out`), after each line: a bench stopped mid-round keeps
the lines it finished (that round is marked `partial`). `--lines 8` runs the first 8 questions,
for a short GPU lease.

    .venv/bin/python bench/voice.py [--speakers 1,4] [--threads 1] [--model NAME] [--lines 20]
                                    [--decide off,on | --no-decide]
                                    [--decision-engine before,grammar,steps]
                                    [--baseline] [--asr-window-s S] [--server-log PATH]
                                    [--first-phrase-words 0,6] [--spoken-lore all,parts]
                                    [--warm off,on] [--turn silence,smart]
                                    [--prepare-batch 4096,16]
                                    [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from _results import fmt, latency, ratio, write_results  # noqa: E402
from mythic.cli._sim import spawned_server  # noqa: E402
from mythic.config import DialogueSettings  # noqa: E402

WORLD = ROOT / "examples" / "worlds" / "ravenmoor"
TURN: dict[str, dict[str, str | None]] = {
    "silence": {"SPEECH__TURN_DETECTOR": "silence", "DIALOGUE__PREEMPT_SPOKEN_LINES": "false"},
    "smart": {"SPEECH__TURN_DETECTOR": None, "DIALOGUE__PREEMPT_SPOKEN_LINES": None},
}
"""`--turn` rounds: the settings each sets (None: the setting's default)."""
NPCS = ["marla", "bran", "grisk", "countess_isolde"]
QUESTIONS = [
    "Is the tavern open tonight?",
    "Where is the old mill?",
    "Who rules this town?",
    "What happened at the cathedral?",
    "Have you seen any wolves lately?",
    "How much for a room?",
    "What do you know about the catacombs?",
    "Is it safe to walk at night?",
    "Who was the last stranger here?",
    "Where can I buy silver?",
    "What is the Drowned Lantern?",
    "Do you trust the guards?",
    "Tell me about the marsh.",
    "Why are the bells ringing?",
    "What do you want from me?",
    "Where does this tunnel lead?",
    "Can you help me find my brother?",
    "What is your name?",
    "Is there work for a hunter?",
    "Good evening, how are you?",
]
SPOKEN_LORE: dict[str, dict[str, str | None]] = {
    "all": {"PREPARE_STEP_TOKENS": "0", "MORE_LORE_TOKENS": "4096"},
    "parts": {"PREPARE_STEP_TOKENS": None, "MORE_LORE_TOKENS": None},
}
"""`--spoken-lore` rounds: the dialogue settings each sets (None: the setting's default)."""
DECISION_ENGINE: dict[str, dict[str, str | None]] = {
    "before": {"GRAMMAR_CHECK_FIRST": "false", "PREFILL_BESIDE_GOLD": "512"},
    "grammar": {"GRAMMAR_CHECK_FIRST": "true", "PREFILL_BESIDE_GOLD": "512"},
    "steps": {"GRAMMAR_CHECK_FIRST": None, "PREFILL_BESIDE_GOLD": None},
}
"""`--decision-engine` rounds: the engine settings each sets (None: the setting's default; 512
is `engine.n_batch`, a whole step)."""
HOPS = ("asr_final", "first_token", "first_audio", "token_to_audio")
"""Times from the end of the player's speech; `token_to_audio`: from the reply's first token
to its first audio (`dialogue.first_phrase_words` acts there)."""


def wer(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word edits, reference words) after lowercasing and dropping punctuation."""
    ref = re.findall(r"[a-z0-9']+", reference.lower())
    hyp = re.findall(r"[a-z0-9']+", hypothesis.lower())
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1], len(ref)


async def synthesise(count: int) -> list[bytes]:
    from mythic.speech import SpeechSettings, TTSPool

    async with TTSPool(SpeechSettings(sample_rate=16000)) as tts:
        return [bytes(3200) + (await tts.speak(q, "human"))[0] for q in QUESTIONS[:count]]


def summarise(rows: list[dict[str, Any]], server: dict[str, Any]) -> dict[str, Any]:
    """A round's hops (p50/p95/p99 on the client), the server's own, and the word error rate."""
    edits = sum(wer(r["question"], r["heard"] or "")[0] for r in rows)
    said = sum(wer(r["question"], "")[1] for r in rows)
    for r in rows:  # the speaking hop alone: the first phrase's tokens, then its synthesis
        done = r["first_audio"] is not None and r["first_token"] is not None
        r["token_to_audio"] = r["first_audio"] - r["first_token"] if done else None
    return {
        "utterances": len(rows),
        "answered": sum(1 for r in rows if r["first_audio"] is not None),
        "client_ms": {h: latency([r[h] for r in rows if r[h] is not None], 1000) for h in HOPS},
        "server_ms": server,
        "wer": round(edits / said, 3) if said else None,
        "rows": rows,
    }


async def speaker(
    url: str, npc: str, lines: list[tuple[str, bytes]], on_row: Callable[[dict[str, Any]], None]
) -> list[dict[str, Any]]:
    from mythic.client import MythicClient
    from mythic.contracts import ToolCall, VoiceFormat

    rows = []

    async def game(call: ToolCall) -> tuple[Any, None]:
        # A game does what the NPC asked at once: unanswered, each call would hold its line
        # for `dialogue.tool_timeout_s` and its retries (21 s by default).
        return "ok", None

    async with MythicClient(
        url, voice=VoiceFormat(binary=True), timeout_s=120, tool_handler=game
    ) as client:
        for text, pcm in lines:
            began = time.perf_counter()
            turn = await client.talk(npc, pcm)
            with contextlib.suppress(TimeoutError):  # a line unanswered stays in the table
                await turn.wait(240)
            end = turn.speech_end_at or time.perf_counter()
            rate = turn.sample_rate or 1
            marks = {
                "asr_final": turn.heard_at,
                "first_token": turn.first_delta_at,
                "first_audio": turn.first_audio_at,
            }
            rows.append(
                {
                    "npc": npc,
                    "question": text,
                    "heard": turn.transcript,
                    **{k: (v - end if v is not None else None) for k, v in marks.items()},
                    "line_s": round(time.perf_counter() - began, 2),
                    "reply_audio_s": round(len(turn.pcm) / 2 / rate, 2),
                    "tools": [c.name for c in turn.tool_calls],
                }
            )
            on_row(rows[-1])
            await asyncio.sleep(0.5)
    return rows


async def server_hops(address: str) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """The server's own trace of the hops (ms), and its turn-taking counters."""
    import httpx

    async with httpx.AsyncClient(base_url=f"http://{address}") as http:
        text = (await http.get("/metrics")).text
    found: dict[str, dict[str, float]] = {}
    pattern = r'mythic_voice_(\w+)_seconds\{quantile="([0-9.]+)"\} ([0-9.e+-]+)'
    for hop, q, value in re.findall(pattern, text):
        found.setdefault(hop, {})[f"p{round(float(q) * 100)}"] = round(float(value) * 1000, 1)
    counters: dict[str, float] = {}
    for name, labels, value in re.findall(
        r"^mythic_voice_(turn_verdicts|preempted)_total\{(\w+=\"\w+\")\} ([0-9.e+-]+)$",
        text,
        re.MULTILINE,
    ):
        counters[f"{name}.{labels.split('=')[1].strip(chr(34))}"] = float(value)
    return found, counters


async def warm_up(address: str, npcs: list[str]) -> float:
    """The game's call when the player comes near `npcs`: their prompts (persona, decision)
    evaluated; seconds."""
    import httpx

    async with httpx.AsyncClient(base_url=f"http://{address}", timeout=600) as http:
        reply = await http.post("/v1/warmup", json={"npcs": npcs})
        reply.raise_for_status()
        return float(reply.json()["seconds"])


async def run_round(
    url: str, speakers: int, audio: list[bytes], on_row: Callable[[dict[str, Any]], None]
) -> list[dict[str, Any]]:
    lines = list(zip(QUESTIONS, audio, strict=False))
    shares = [lines[i::speakers] for i in range(speakers)]
    results = await asyncio.gather(
        *(speaker(url, NPCS[i], share, on_row) for i, share in enumerate(shares))
    )
    return [row for rows in results for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speakers", default="1,4")
    parser.add_argument("--threads", type=int, default=1, help="cores for the server's model")
    parser.add_argument(
        "--lines",
        type=int,
        default=len(QUESTIONS),
        help=f"the first N of the {len(QUESTIONS)} questions (fewer for a short lease)",
    )
    parser.add_argument(
        "--model", default=None, help="the server's dialogue model (default: engine.dialogue_model)"
    )
    parser.add_argument(
        "--no-decide", action="store_true", help="no per-line intent/tool decision (dialogue only)"
    )
    parser.add_argument(
        "--decide",
        default=None,
        help="rounds with the per-line decision off and on, e.g. off,on (default: on, or off "
        "with --no-decide); the ratio is against the first",
    )
    parser.add_argument(
        "--decision-engine",
        default=None,
        help="rounds with the engine settings that make the decision cheaper, e.g. "
        "before,grammar,steps (default: the settings', steps); the ratio is against the first",
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="first a round with the work ahead of the line's end off (no prompt prepared "
        "while the player speaks, no early final, a 30 s Whisper window): the ratio's baseline",
    )
    parser.add_argument(
        "--asr-window-s",
        type=float,
        default=None,
        help="speech.asr_window_s of the rounds with the work ahead on (default: the setting's)",
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "voice.json", help="results"
    )
    parser.add_argument(
        "--first-phrase-words",
        default=None,
        help="rounds with each of these dialogue.first_phrase_words, e.g. 0,6 (default: the "
        "setting's value only); the ratio is against the first",
    )
    parser.add_argument(
        "--spoken-lore",
        default=None,
        help="rounds with each of these, e.g. all,parts: `all` has every spoken line wait for "
        "all its lore (dialogue.prepare_step_tokens 0, more_lore_tokens 4096), `parts` the "
        "settings' own (the lore prepared while the player speaks, and more_lore_tokens more); "
        "the ratio is against the first",
    )
    parser.add_argument(
        "--warm",
        default="off",
        help="rounds without and with the NPCs' prompts warmed before the first line, e.g. "
        "off,on (POST /v1/warmup, as a game does when the player comes near); the ratio is "
        "against the first",
    )
    parser.add_argument(
        "--turn",
        default="smart",
        help="rounds with turns ended on silence alone and no preemptive reply (silence) and "
        "with the turn model and preemption (smart, the defaults), e.g. silence,smart; the "
        "ratio is against the first",
    )
    parser.add_argument(
        "--prepare-batch",
        default=None,
        help="rounds with each of these dialogue.prepare_batch_tokens, e.g. 4096,16 (default: "
        "the setting's value only); the ratio is against the first",
    )
    parser.add_argument(
        "--server-log",
        type=Path,
        default=None,
        help="append the servers' logs to this file (with MYTHIC_SERVER__LOG_LEVEL=debug: "
        "each engine request's prompt and cached tokens)",
    )
    args = parser.parse_args()
    if args.model:
        os.environ["MYTHIC_ENGINE__DIALOGUE_MODEL"] = args.model
    if args.decide and args.no_decide:
        parser.error("give --decide or --no-decide, not both")
    decides = args.decide.split(",") if args.decide else ["off" if args.no_decide else "on"]
    if set(decides) - {"off", "on"}:
        parser.error("--decide takes off and on")
    engines = args.decision_engine.split(",") if args.decision_engine else ["steps"]
    if set(engines) - set(DECISION_ENGINE):
        parser.error(f"--decision-engine takes {', '.join(DECISION_ENGINE)}")
    counts = [int(n) for n in args.speakers.split(",")]
    if not 1 <= args.lines <= len(QUESTIONS):
        parser.error(f"--lines takes 1 to {len(QUESTIONS)}")
    audio = asyncio.run(synthesise(args.lines))
    rounds: list[dict[str, Any]] = []
    default_words = int(
        os.environ.get(
            "MYTHIC_DIALOGUE__FIRST_PHRASE_WORDS",
            DialogueSettings.model_fields["first_phrase_words"].default,
        )
    )
    words = [int(w) for w in args.first_phrase_words.split(",")] if args.first_phrase_words else []
    lores = args.spoken_lore.split(",") if args.spoken_lore else ["parts"]
    if set(lores) - set(SPOKEN_LORE):
        parser.error(f"--spoken-lore takes {', '.join(SPOKEN_LORE)}")
    warms = args.warm.split(",")
    if set(warms) - {"off", "on"}:
        parser.error("--warm takes off and on")
    turns = args.turn.split(",")
    if set(turns) - set(TURN):
        parser.error(f"--turn takes {', '.join(TURN)}")
    default_batch = DialogueSettings.model_fields["prepare_batch_tokens"].default
    batches = [int(b) for b in args.prepare_batch.split(",")] if args.prepare_batch else []
    if any(b < 1 for b in batches):
        parser.error("--prepare-batch takes token counts of at least 1")
    plan = [
        (count, True, w, lore, decide, engine, warm == "on", turn, batch)
        for batch in batches or [default_batch]
        for turn in turns
        for count in counts
        for w in words or [default_words]
        for lore in lores
        for decide in decides
        for engine in engines
        for warm in warms
    ]
    if args.baseline:
        plan.insert(0, (counts[0], False, *plan[0][2:]))

    def save(rounds: list[dict[str, Any]], *, quiet: bool = False) -> None:
        write_results(
            args.out.resolve(),
            ROOT,
            benchmark="voice",
            server_threads=args.threads,
            engine_backend=os.environ.get("MYTHIC_ENGINE__BACKEND", "llama.cpp"),
            engine_device=os.environ.get("MYTHIC_ENGINE__DEVICE", "cpu"),
            engine_gpu_layers=int(os.environ.get("MYTHIC_ENGINE__N_GPU_LAYERS", "0")),
            knowledge_retrieval=os.environ.get("MYTHIC_KNOWLEDGE__RETRIEVAL", "hybrid"),
            asr_window_s=args.asr_window_s or 30.0,
            dialogue_model=args.model or "default (engine.dialogue_model)",
            results=rounds,
            quiet=quiet,
        )

    # Cold unless the round warms (`--warm on`): no background warm-up racing the first lines.
    os.environ["MYTHIC_SERVER__WARM_NPCS"] = "0"
    for count, ahead, first_words, lore, decide, engine, warm, turn, batch in plan:
        os.environ["MYTHIC_DIALOGUE__PREPARE_BATCH_TOKENS"] = str(batch)
        for name, value in TURN[turn].items():
            if value is None:
                os.environ.pop(f"MYTHIC_{name}", None)
            else:
                os.environ[f"MYTHIC_{name}"] = value
        os.environ["MYTHIC_DIALOGUE__FIRST_PHRASE_WORDS"] = str(first_words)
        for name, value in DECISION_ENGINE[engine].items():
            if value is None:
                os.environ.pop(f"MYTHIC_ENGINE__{name}", None)
            else:
                os.environ[f"MYTHIC_ENGINE__{name}"] = value
        os.environ["MYTHIC_DIALOGUE__DECIDE"] = "true" if decide == "on" else "false"
        for name, value in SPOKEN_LORE[lore].items():
            if value is None:
                os.environ.pop(f"MYTHIC_DIALOGUE__{name}", None)
            else:
                os.environ[f"MYTHIC_DIALOGUE__{name}"] = value
        # A fresh server per round, so /metrics holds that round's traces only.
        os.environ["MYTHIC_DIALOGUE__PREFILL_WHILE_SPEAKING"] = "true" if ahead else "false"
        os.environ["MYTHIC_SPEECH__EARLY_FINAL_MS"] = "128" if ahead else "0"
        # The baseline's Whisper encodes faster-whisper's full 30 s window for every
        # transcript, partials too, as before `speech.asr_window_s` and `partial_window_s`.
        for name, window in (
            ("ASR_WINDOW_S", args.asr_window_s if ahead else 30),
            ("PARTIAL_WINDOW_S", None if ahead else 30),
        ):
            if window is None:
                os.environ.pop(f"MYTHIC_SPEECH__{name}", None)
            else:
                os.environ[f"MYTHIC_SPEECH__{name}"] = str(window)
        setting = {
            "speakers": count,
            "ahead": ahead,
            "first_phrase_words": first_words,
            "spoken_lore": lore,
            "decide": decide == "on",
            "decision_engine": engine,
            "warm": warm,
            "turn": turn,
            "prepare_batch_tokens": batch,
        }
        done: list[dict[str, Any]] = []

        def on_row(
            row: dict[str, Any], setting: dict[str, Any] = setting, done: list[Any] = done
        ) -> None:
            # Each line as it ends: a bench stopped mid-round (a short lease) keeps its lines.
            done.append(dict(row))
            try:  # a few kB: well under a millisecond beside the hops it measures
                save([*rounds, {**setting, "partial": True, **summarise(done, {})}], quiet=True)
            except OSError as exc:
                print(f"  could not save the lines so far: {exc}", flush=True)
            first = row["first_audio"]
            heard = f"first audio {first * 1000:.0f} ms" if first is not None else "no answer"
            print(
                f"  {len(done)}/{len(audio)} {row['npc']}: {heard}; line {row['line_s']} s, "
                f"reply {row['reply_audio_s']} s of audio, tools {row['tools'] or 'none'}",
                flush=True,
            )

        with spawned_server(
            WORLD, threads=args.threads, voice=True, nice=0, log_to=args.server_log
        ) as url:
            address = url.removeprefix("ws://").removesuffix("/v1/ws")
            if warm:
                seconds = asyncio.run(warm_up(address, NPCS[:count]))
                setting["warm_up_s"] = round(seconds, 2)
                print(f"  {', '.join(NPCS[:count])}: prompts warmed in {seconds:.2f} s", flush=True)
            rows = asyncio.run(run_round(url, count, audio, on_row))
            server, counters = asyncio.run(server_hops(address))
        rounds.append({**setting, **summarise(rows, server), "turn_taking": counters})
        save(rounds)
    base = rounds[0]["client_ms"]
    print("end of speech -> each hop, ms, on the client (server's own trace in brackets)")
    print(
        f"{'speakers':>8} {'turn':<8}{'batch':>6} {'ahead':<6}{'warm':<5}{'words':>5} {'lore':<6}"
        f"{'decide':<7}{'engine':<8}"
        f"{'hop':<16}{'p50':>8}{'p95':>8}{'p99':>8}{'server p50':>12}{'x p50':>7}"
    )
    for r in rounds:
        for hop in HOPS:
            ms = r["client_ms"][hop]
            own = r["server_ms"].get(hop, {}).get("p50")
            print(
                f"{r['speakers']:>8} {r.get('turn', 'smart'):<8}"
                f"{r.get('prepare_batch_tokens', '-'):>6} {'on' if r['ahead'] else 'off':<6}"
                f"{'on' if r.get('warm') else 'off':<5}"
                f"{r['first_phrase_words']:>5} {r['spoken_lore']:<6}"
                f"{'on' if r['decide'] else 'off':<7}{r['decision_engine']:<8}{hop:<16}"
                f"{fmt(ms['p50'], '.0f'):>8}{fmt(ms['p95'], '.0f'):>8}"
                f"{fmt(ms['p99'], '.0f'):>8}{fmt(own, '.0f'):>12}"
                f"{fmt(ratio(ms['p50'], base[hop]['p50']), '.2f'):>7}"
            )
        print(
            f"{'':>8} answered {r['answered']}/{r['utterances']}, ASR word error rate "
            f"{r['wer']}, turn-taking {r.get('turn_taking') or '-'}"
        )


if __name__ == "__main__":
    main()
