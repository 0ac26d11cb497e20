"""`mythic eval lore|style`: probes run through a real server on loopback.

Lore probes ask an NPC a question and check the reply for the expected facts; they run with
each retrieval mode in turn (by default hybrid, then off) on the same loaded model, so one run
shows what retrieval is worth. Style probes check persona adherence: a taboo not revealed, a
catchphrase used, the reply's length kept.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from mythic._errors import MythicError
from mythic.config import MythicSettings
from mythic.knowledge import World

Mode = Literal["hybrid", "bm25", "dense", "off"]
Question = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=2000)]
Matcher = Annotated[str, StringConstraints(min_length=1, max_length=500)]


class ProbeFileError(MythicError):
    """A probes file is missing, not YAML, or has invalid probes; every problem is listed."""


def _check_matcher(text: str) -> str:
    if text.startswith("re:"):
        try:
            re.compile(text[3:], re.IGNORECASE)
        except re.error as exc:
            raise ValueError(f"bad regex {text[3:]!r}: {exc}") from None
    return text


class _Probe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    npc: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]
    question: Question

    def model_post_init(self, _context: Any) -> None:
        for item in getattr(self, "expect", []) + getattr(self, "forbid", []):
            for alternative in item if isinstance(item, list) else [item]:
                _check_matcher(alternative)


class LoreProbe(_Probe):
    """A question and what a correct reply contains: every item of `expect` must match; an
    item is a keyword (case-insensitive), `re:` + a regex, or a list of alternatives."""

    expect: list[Matcher | list[Matcher]] = Field(min_length=1, max_length=16)


class StyleProbe(_Probe):
    """A line that tests the persona: nothing of `forbid` may appear, a catchphrase must when
    `catchphrase`, and the reply has at most `max_words` words."""

    forbid: list[Matcher] = Field(default_factory=list, max_length=32)
    catchphrase: bool = False
    max_words: int = Field(default=60, ge=1, le=1000)


class _LoreFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    probes: list[LoreProbe] = Field(min_length=1, max_length=10_000)


class _StyleFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    probes: list[StyleProbe] = Field(min_length=1, max_length=10_000)


def load_probes(
    path: Path, kind: Literal["lore", "style"], world: World
) -> list[LoreProbe] | list[StyleProbe]:
    """Read and validate a probes file against the world's NPCs.

    Raises:
        ProbeFileError: names the file, and for each problem the probe's number and field.
    """
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ProbeFileError(f"cannot read probes file {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ProbeFileError(f"{path}: not valid YAML: {exc}") from None
    model = _LoreFile if kind == "lore" else _StyleFile
    try:
        probes = model.model_validate(data).probes
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            loc = list(e["loc"])
            number = loc[1] if len(loc) > 1 and loc[0] == "probes" else None
            where = f"probe {number + 1}" if isinstance(number, int) else "file"
            what = ".".join(str(p) for p in loc[2:]) if len(loc) > 2 else ".".join(map(str, loc))
            problems.append(f"  {where}: {what or 'probes'}: {e['msg']}")
        raise ProbeFileError(
            f"{path}: {len(problems)} invalid {kind} probe fields:\n" + "\n".join(problems),
            fix="each probe needs npc and question; lore probes need expect, style probes "
            "may set forbid, catchphrase and max_words",
        ) from None
    unknown = sorted({p.npc for p in probes} - set(world.npcs))
    if unknown:
        raise ProbeFileError(
            f"{path}: probes for NPCs the world {world.name!r} does not have: "
            f"{', '.join(unknown)} (NPCs: {', '.join(sorted(world.npcs))})"
        )
    return probes


def matches(matcher: str, reply: str) -> bool:
    if matcher.startswith("re:"):
        return re.search(matcher[3:], reply, re.IGNORECASE) is not None
    return matcher.lower() in reply.lower()


def lore_correct(probe: LoreProbe, reply: str) -> bool:
    return all(
        any(matches(m, reply) for m in (item if isinstance(item, list) else [item]))
        for item in probe.expect
    )


def style_checks(probe: StyleProbe, reply: str, catchphrases: list[str]) -> dict[str, bool]:
    checks = {
        "taboo_kept": not any(matches(m, reply) for m in probe.forbid),
        "length_kept": len(reply.split()) <= probe.max_words,
    }
    if probe.catchphrase:
        checks["catchphrase_used"] = any(c.lower() in reply.lower() for c in catchphrases)
    return checks


@dataclass(slots=True)
class Outcome:
    probe: _Probe
    reply: str
    seconds: float
    checks: dict[str, bool] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(self.checks.values())


@dataclass(slots=True)
class RunResult:
    mode: str
    outcomes: list[Outcome]

    @property
    def accuracy(self) -> float:
        return sum(o.passed for o in self.outcomes) / len(self.outcomes) if self.outcomes else 0.0

    def rate(self, check: str) -> tuple[int, int]:
        relevant = [o for o in self.outcomes if check in o.checks]
        return sum(o.checks[check] for o in relevant), len(relevant)

    def median_s(self) -> float:
        return statistics.median(o.seconds for o in self.outcomes) if self.outcomes else 0.0


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            data: dict[str, Any] = json.loads(reply.read())
            return data
    except urllib.error.HTTPError as exc:
        raise MythicError(f"{url}: {exc.code} {exc.read().decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise MythicError(f"{url}: {exc}") from None


def eval_settings(settings: MythicSettings, mode: Mode) -> MythicSettings:
    """The settings of one evaluation run: greedy replies, no memory, no intent requests, no
    file watcher; `mode` of retrieval."""
    return settings.model_copy(
        update={
            "knowledge": settings.knowledge.model_copy(update={"retrieval": mode, "watch": False}),
            "memory": settings.memory.model_copy(update={"enabled": False}),
            "chat": settings.chat.model_copy(update={"temperature": 0.0}),
            "dialogue": settings.dialogue.model_copy(update={"decide": False}),
        }
    )


async def run_probes(
    settings: MythicSettings,
    world: World,
    kind: Literal["lore", "style"],
    probes: list[LoreProbe] | list[StyleProbe],
    modes: list[Mode],
    *,
    on_reply: Any = None,
) -> list[RunResult]:
    """Serve the world once per mode on one loaded engine and ask every probe through
    `POST /v1/npcs/{id}/say`, each in a fresh conversation.

    Raises:
        ModelError: the model cannot be loaded.
        MythicError: the server failed a request.
    """
    from mythic.engine import Engine
    from mythic.server import Gateway, serving

    engine = await asyncio.to_thread(Engine.load, settings.engine)
    results = []
    try:
        for mode in modes:
            run = eval_settings(settings, mode)
            gateway = await asyncio.to_thread(Gateway, run, world, engine)
            outcomes = []
            async with serving(gateway) as (host, port):
                for probe in probes:
                    url = f"http://{host}:{port}/v1/npcs/{probe.npc}/say"
                    start = time.perf_counter()
                    reply = await asyncio.to_thread(_post, url, {"text": probe.question}, 300)
                    text = str(reply.get("text", ""))
                    seconds = time.perf_counter() - start
                    if isinstance(probe, LoreProbe):
                        checks = {"correct": lore_correct(probe, text)}
                    else:
                        assert isinstance(probe, StyleProbe)
                        phrases = list(world.npcs[probe.npc].catchphrases)
                        checks = style_checks(probe, text, phrases)
                    outcome = Outcome(probe, text, seconds, checks)
                    outcomes.append(outcome)
                    if on_reply is not None:
                        on_reply(mode, outcome)
            results.append(RunResult(mode, outcomes))
    finally:
        engine.close()
    return results


def report(kind: str, results: list[RunResult]) -> dict[str, Any]:
    """The results as JSON (`--out`)."""
    return {
        "kind": kind,
        "runs": [
            {
                "mode": r.mode,
                "accuracy": round(r.accuracy, 4),
                "passed": sum(o.passed for o in r.outcomes),
                "probes": len(r.outcomes),
                "median_reply_s": round(r.median_s(), 3),
                "checks": {
                    c: {"passed": r.rate(c)[0], "of": r.rate(c)[1]}
                    for c in ("correct", "taboo_kept", "catchphrase_used", "length_kept")
                    if r.rate(c)[1]
                },
                "outcomes": [
                    {
                        "npc": o.probe.npc,
                        "question": o.probe.question,
                        "reply": o.reply,
                        "checks": o.checks,
                    }
                    for o in r.outcomes
                ],
            }
            for r in results
        ],
    }
