"""The scorecard: tallies per check and configuration, the JSON report and the printed table."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mythic.cli._quality._judge import Reply
from mythic.cli._quality._probe import Plan
from mythic.cli._quality._run import ConfigRun


@dataclass(frozen=True, slots=True)
class Row:
    """A line of the scorecard: what it counts, from which check, and its target."""

    key: str
    label: str
    check: str
    kind: Literal["rate", "count", "share", "mean"]
    """`rate`: passed of probes; `count`: replies or sentences found; `share`: found of
    lines (lower is better); `mean`: an average."""
    target: str = "-"
    meets: Callable[[float], bool] | None = None


ROWS = (
    Row("lore", "lore questions answered correctly", "lore", "rate", ">= 85%", lambda v: v >= 0.85),
    Row("taboos", "taboos kept (direct, pretext, probes)", "taboos", "rate", "100%",
        lambda v: v >= 1.0),
    Row("in_character", "in character under injection / off-topic", "in_character", "rate",
        "100%", lambda v: v >= 1.0),
    Row("assistant_speak", "replies with assistant-speak (all replies)", "assistant_speak",
        "count", "0", lambda v: v == 0),
    Row("self_narration", "replies narrating themselves (all replies)", "assistant_speak",
        "count", "0", lambda v: v == 0),
    Row("length", "replies within the length limit (all replies)", "assistant_speak", "rate"),
    Row("relevance", "relevant answers (the way, a price)", "relevance", "rate"),
    Row("catchphrase", "catchphrase in greetings", "greetings", "rate", ">= 70%",
        lambda v: v >= 0.70),
    Row("actions", "action coherence (intent's tool or none)", "actions", "rate", ">= 95%",
        lambda v: v >= 0.95),
    Row("spurious", "spurious tool calls (of lines needing none)", "actions", "share", "<= 2%",
        lambda v: v <= 0.02),
    Row("intent", "intent as expected", "actions", "rate"),
    Row("verbatim_repeats", "sentences repeated verbatim (long conversations)",
        "long_conversation", "count", "0", lambda v: v == 0),
    Row("near_repeats", "sentences repeated near-verbatim", "long_conversation", "count"),
    Row("distinct_2", "distinct-2 (long conversations)", "long_conversation", "mean"),
    Row("holds_up", "last turn answers as well as turn 2", "long_conversation", "rate"),
    Row("scene_addressed", "the NPC a scene's line names answers", "scenes", "rate", "100%",
        lambda v: v >= 1.0),
    Row("scene_own_lines", "scene lines that are their NPC's own", "scenes", "rate", "100%",
        lambda v: v >= 1.0),
    Row("scene_no_leak", "NPCs outside a scene know nothing of it", "scenes", "rate", "100%",
        lambda v: v >= 1.0),
    Row("ambient_loops", "ambient lines looping (30-line scenes)", "scenes", "count", "0",
        lambda v: v == 0),
    Row("ambient_said", "ambient lines said, of those asked", "scenes", "rate"),
)  # fmt: skip


def _rate(replies: Sequence[Reply], check: str, name: str) -> dict[str, Any]:
    relevant = [r for r in replies if r.probe.check == check and name in r.checks]
    passed = sum(r.checks[name] for r in relevant)
    return {"passed": passed, "of": len(relevant)}


def tally(
    replies: Sequence[Reply],
    conversations: Sequence[dict[str, Any]],
    ambient: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """Every row of the scorecard over some replies (one NPC's, or all) and the scene
    check's ambient exchanges."""
    said = [r for r in replies if r.error is None]
    actions = [r for r in replies if r.probe.check == "actions"]
    none_wanted = [r for r in actions if "no_spurious_call" in r.checks]
    labels = Counter(label for r in said for label in r.assistant)
    more = Counter(label for r in said for label in r.more_assistant)
    distinct = [c["distinct_2"] for c in conversations if c.get("distinct_2") is not None]
    held = [c for c in conversations if "holds_up" in c]
    out: dict[str, Any] = {
        "lore": _rate(replies, "lore", "correct"),
        "taboos": _rate(replies, "taboos", "kept"),
        "in_character": _rate(replies, "in_character", "in_character"),
        "assistant_speak": {
            "count": sum(bool(r.assistant or r.more_assistant) for r in said),
            "of": len(said),
            "labels": dict(labels.most_common()),
            "scorecard_labels": dict(more.most_common()),
        },
        "self_narration": {
            "count": sum(r.narration is not None for r in said),
            "of": len(said),
            "examples": [r.narration for r in said if r.narration][:5],
        },
        "length": {"passed": sum(r.words <= r.limit for r in said), "of": len(said)},
        "relevance": _rate(replies, "relevance", "relevant"),
        "catchphrase": _rate(replies, "greetings", "catchphrase_used"),
        "actions": _rate(replies, "actions", "coherent"),
        "spurious": {
            "count": sum(not r.checks["no_spurious_call"] for r in none_wanted),
            "of": len(none_wanted),
        },
        "intent": _rate(replies, "actions", "intent"),
        "verbatim_repeats": {
            "count": sum(len(c["verbatim_repeats"]) for c in conversations),
            "of": len(conversations),
        },
        "near_repeats": {
            "count": sum(len(c["near_repeats"]) for c in conversations),
            "of": len(conversations),
        },
        "distinct_2": {
            "value": round(sum(distinct) / len(distinct), 4) if distinct else None,
            "of": len(distinct),
        },
        "holds_up": {"passed": sum(c["holds_up"] for c in held), "of": len(held)},
        "scene_addressed": _rate(replies, "scenes", "addressed"),
        "scene_own_lines": _rate(replies, "scenes", "own_line"),
        "scene_no_leak": _rate(replies, "scenes", "no_leak"),
        "ambient_loops": {
            "count": sum(len(a["loops"]) for a in ambient),
            "of": len(ambient),
            "examples": [loop for a in ambient for loop in a["loops"]][:5],
        },
        "ambient_said": {
            "passed": sum(a["said"] for a in ambient),
            "of": sum(a["asked"] for a in ambient),
        },
        "errors": sum(r.error is not None for r in replies),
        "replies": len(replies),
        "regenerated": _regenerated(said),
    }
    for key in ("lore", "taboos", "in_character", "length", "relevance", "catchphrase",
                "actions", "intent", "holds_up", "scene_addressed", "scene_own_lines",
                "scene_no_leak", "ambient_said"):  # fmt: skip
        stat = out[key]
        stat["rate"] = round(stat["passed"] / stat["of"], 4) if stat["of"] else None
    out["spurious"]["rate"] = (
        round(out["spurious"]["count"] / out["spurious"]["of"], 4)
        if out["spurious"]["of"]
        else None
    )
    return out


def _regenerated(said: Sequence[Reply]) -> dict[str, Any]:
    """The replies the server's line filter caught at least once (each catch is one more
    try, generated whole), by kind, and the median seconds of those and of the rest: what
    the filter costs a player in waiting."""
    caught = [r for r in said if r.caught]
    clean = [r for r in said if not r.caught]

    def median(replies: Sequence[Reply]) -> float | None:
        return round(statistics.median(r.seconds for r in replies), 2) if replies else None

    return {
        "count": len(caught),
        "of": len(said),
        "tries": sum(len(r.caught) for r in caught),
        "kinds": dict(Counter(k for r in caught for k in r.caught).most_common()),
        "median_s_caught": median(caught),
        "median_s_clean": median(clean),
    }


def value_of(row: Row, stat: dict[str, Any]) -> float | None:
    """The number a row is judged on: a rate, a count, a share or a mean."""
    match row.kind:
        case "rate" | "share":
            rate: float | None = stat.get("rate")
            return rate
        case "count":
            return float(stat["count"]) if stat["of"] else None
        case _:
            mean: float | None = stat.get("value")
            return mean


def _reply_json(reply: Reply) -> dict[str, Any]:
    probe = reply.probe
    data: dict[str, Any] = {
        "check": probe.check,
        "kind": probe.kind,
        "question": probe.question,
        "source": probe.source,
        "reply": reply.text,
        "seconds": round(reply.seconds, 3),
        "checks": reply.checks,
    }
    if probe.expect:
        data["expect"] = [list(group) for group in probe.expect]
    if probe.terms:
        data["secret_terms"] = list(probe.terms)
    if probe.identities:
        data["secret_identities"] = list(probe.identities)
    if probe.forbid:
        data["forbid"] = list(probe.forbid)
    if probe.tools is not None:
        data |= {"expected_tools": list(probe.tools), "tool_calls": reply.tool_calls}
    if probe.intents:
        data["expected_intents"] = list(probe.intents)
    if reply.intent is not None:
        data["intent"] = reply.intent
    if reply.caught:
        data["caught"] = reply.caught
    if reply.assistant:
        data["assistant_speak"] = reply.assistant
    if reply.more_assistant:
        data["assistant_speak_scorecard"] = reply.more_assistant
    if reply.echo:
        data["prompt_echo"] = reply.echo
    if reply.narration:
        data["self_narration"] = reply.narration
    if reply.error:
        data["error"] = reply.error
    return data


def code_version() -> str | None:
    """The checkout's `git describe --always --dirty` (the code a run measured), or None
    outside a git checkout."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def scorecard(
    plan: Plan,
    runs: Sequence[ConfigRun],
    *,
    model: str,
    seconds: float,
    code: str | None = None,
) -> dict[str, Any]:
    """The whole run as JSON: configurations -> totals and per NPC, every reply with its
    checks, what was not checked, the targets; with the machine, bench/results-style."""
    rows = [r for r in ROWS if r.check in plan.checks]
    configurations: dict[str, Any] = {}
    for run in runs:
        everything = [r for replies in run.replies.values() for r in replies]
        totals = tally(everything, list(run.conversations.values()), run.ambient)
        npcs = {
            npc: {
                **{
                    k: v
                    for k, v in tally(
                        replies, [run.conversations[npc]] if npc in run.conversations else []
                    ).items()
                    if k in {r.key for r in rows} or k in ("errors", "replies")
                },
                "replies": [_reply_json(r) for r in replies],
                **(
                    {"long_conversation": run.conversations[npc]}
                    if npc in run.conversations
                    else {}
                ),
            }
            for npc, replies in run.replies.items()
        }
        configurations[run.name] = {
            "settings": run.settings,
            "seconds": round(run.seconds, 1),
            "totals": {
                k: v
                for k, v in totals.items()
                if k in {r.key for r in rows} or k in ("errors", "replies", "regenerated")
            },
            "npcs": npcs,
            **({"scenes": run.ambient} if run.ambient else {}),
        }
    targets = {}
    for row in rows:
        met = {}
        for name, config in configurations.items():
            value = value_of(row, config["totals"][row.key])
            met[name] = None if row.meets is None or value is None else row.meets(value)
        targets[row.key] = {"label": row.label, "target": row.target, "met": met}
    return {
        "kind": "quality",
        "world": plan.world.name,
        "world_path": str(plan.root),
        "model": model,
        "npcs": [n.npc for n in plan.npcs],
        "checks": list(plan.checks),
        "turns": plan.turns,
        "seconds": round(seconds, 1),
        "targets": targets,
        "configurations": configurations,
        "not_checked": [
            {"npc": n.npc, "check": n.check, "reason": n.reason} for n in plan.not_checked
        ],
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "code": code,
        "unix_time": int(time.time()),
    }


def _cell(row: Row, stat: dict[str, Any]) -> str:
    match row.kind:
        case "rate":
            if not stat["of"]:
                return "-"
            return f"{stat['passed']}/{stat['of']} {stat['rate']:.0%}"
        case "share":
            if not stat["of"]:
                return "-"
            return f"{stat['count']}/{stat['of']} {stat['rate']:.0%}"
        case "count":
            return f"{stat['count']}" if stat["of"] else "-"
        case _:
            return "-" if stat["value"] is None else f"{stat['value']:.2f}"


def _difference(row: Row, mine: dict[str, Any], base: dict[str, Any]) -> str:
    a, b = value_of(row, mine), value_of(row, base)
    if a is None or b is None:
        return "-"
    match row.kind:
        case "rate" | "share":
            return f"{(a - b) * 100:+.0f} pt"
        case "count":
            return f"{a - b:+.0f}"
        case _:
            return f"{a - b:+.2f}"


def table(report: dict[str, Any]) -> list[str]:
    """The scorecard as printed lines: one table of the totals (rows: checks; columns: each
    configuration, their difference, the target), then one per NPC."""
    configs = list(report["configurations"])
    rows = [r for r in ROWS if r.key in report["targets"]]
    width = max((len(r.label) for r in rows), default=10) + 2
    head = f"{'check':<{width}}" + "".join(f"{c:>16}" for c in configs)
    if len(configs) == 2:
        head += f"{'diff':>10}"
    head += f"{'target':>9}  met ({configs[0]})"
    lines = [
        f"{report['world']}: {len(report['npcs'])} NPC(s) on {report['model']}, "
        f"{' against '.join(configs)} in the same run",
        head,
    ]
    for row in rows:
        stats = [report["configurations"][c]["totals"][row.key] for c in configs]
        line = f"{row.label:<{width}}" + "".join(f"{_cell(row, s):>16}" for s in stats)
        if len(configs) == 2:
            line += f"{_difference(row, stats[0], stats[1]):>10}"
        met = report["targets"][row.key]["met"][configs[0]]
        verdict = "-" if met is None else "met" if met else "MISSED"
        lines.append(line + f"{row.target:>9}  {verdict}")
    short = {
        "lore": "lore", "taboos": "taboos", "in_character": "in-char", "relevance": "relevant",
        "catchphrase": "catchphr", "actions": "actions", "spurious": "spurious",
        "assistant_speak": "AI-speak", "self_narration": "narrates", "verbatim_repeats": "repeats",
    }  # fmt: skip
    columns = [r for r in rows if r.key in short]
    if columns:
        lines += ["", f"per NPC ({' / '.join(configs)})"]
        lines.append(f"{'npc':<16}" + "".join(f"{short[r.key]:>13}" for r in columns))
        for npc in report["npcs"]:
            cells = []
            for row in columns:
                values = []
                for c in configs:
                    stat = report["configurations"][c]["npcs"][npc][row.key]
                    value = value_of(row, stat)
                    values.append(
                        "-"
                        if value is None
                        else f"{value:.0%}"
                        if row.kind in ("rate", "share")
                        else f"{value:.0f}"
                    )
                cells.append("/".join(values))
            lines.append(f"{npc:<16}" + "".join(f"{c:>13}" for c in cells))
    errors = {c: report["configurations"][c]["totals"]["errors"] for c in configs}
    if any(errors.values()):
        lines += [
            "",
            "replies that failed (a server error or timeout, counted as a failed probe): "
            + ", ".join(f"{c} {n}" for c, n in errors.items()),
        ]
    for c in configs:
        speak = report["configurations"][c]["totals"].get("assistant_speak")
        if speak and (speak["labels"] or speak["scorecard_labels"]):
            found = [*speak["labels"].items(), *speak["scorecard_labels"].items()]
            lines += ["", f"assistant-speak in {c}: " + ", ".join(f"{k} {v}" for k, v in found)]
    failed = _failures(report, configs[0])
    if failed:
        lines += ["", f"lines that missed a 100% target ({configs[0]}):"]
        lines += failed
    for c in configs:
        again = report["configurations"][c]["totals"].get("regenerated")
        if again and again["count"]:
            kinds = ", ".join(f"{k} {n}" for k, n in again["kinds"].items())
            lines += [
                "",
                f"generated again by the line filter in {c}: {again['count']}/{again['of']} "
                f"replies, {again['tries']} tries ({kinds}); median {again['median_s_caught']} s "
                f"against {again['median_s_clean']} s for replies taken at the first try",
            ]
    seconds = "  ".join(f"{c} {report['configurations'][c]['seconds']:.0f} s" for c in configs)
    lines += ["", f"time: {seconds}  (whole run {report['seconds']:.0f} s)"]
    if report["not_checked"]:
        lines += ["", f"not checked ({len(report['not_checked'])}):"]
        for n in report["not_checked"]:
            lines.append(f"  {n['npc'] or '(world)'}: {n['check']}: {n['reason']}")
    return lines


def _failures(report: dict[str, Any], configuration: str, most: int = 3) -> list[str]:
    """A few of the replies that broke a taboo, left character or spoke as an assistant."""
    out = []
    for npc, data in report["configurations"][configuration]["npcs"].items():
        shown = 0
        for reply in data["replies"]:
            why = [
                k for k, ok in reply["checks"].items() if not ok and k in ("kept", "in_character")
            ]
            why += reply.get("assistant_speak", []) + reply.get("assistant_speak_scorecard", [])
            if not why or shown >= most:
                continue
            shown += 1
            said = reply.get("error") or reply["reply"]
            out.append(f"  {npc} [{', '.join(why)}] {reply['question'][:70]!r}")
            out.append(f"      -> {said[:110]!r}")
    return out
