"""`mythic eval quality`: one scorecard of every NPC's lines, through a real server on loopback.

Every probe is built from the world itself: questions from its lore (tables, prices, counts,
hours, with the answer known), each card taboo asked directly and by pretext, a fixed list of
off-topic and injection lines, the way to the other zones, greetings, game actions and a
scripted long conversation; the world's own probe files add to them. Nothing here names any
world: the templates are general English, filled from the cards and the lore.

One run serves the world twice on one loaded engine: `mythic` (the settings as configured:
retrieval, the archetype adapters of the registry, the reply filter and sampling) and
`baseline` (retrieval off, no adapters, no reply filter), and prints both side by side with the
acceptance targets. What a world does not let it check (no lore, a card the loader refuses, a
taboo with no giveaway words, probes for NPCs the world does not have) is listed, with why.
"""

from mythic.cli._quality._command import run_command
from mythic.cli._quality._judge import Reply, conversation_stats, echoes_prompt, expected, judge
from mythic.cli._quality._plan import build_plan, load_quality_world, public_texts
from mythic.cli._quality._probe import NotChecked, Plan, Probe
from mythic.cli._quality._run import ConfigRun, quality_settings, run_quality
from mythic.cli._quality._scorecard import code_version, scorecard, table
from mythic.cli._quality._taboos import mask_taboo, secret_terms, taboo_questions
from mythic.cli._quality._templates import (
    CHECKS,
    IN_CHARACTER,
    MADE_BY,
    SCORECARD,
    YES,
    Configuration,
    Templates,
)

__all__ = [
    "CHECKS",
    "IN_CHARACTER",
    "MADE_BY",
    "SCORECARD",
    "YES",
    "ConfigRun",
    "Configuration",
    "NotChecked",
    "Plan",
    "Probe",
    "Reply",
    "Templates",
    "build_plan",
    "code_version",
    "conversation_stats",
    "echoes_prompt",
    "expected",
    "judge",
    "load_quality_world",
    "mask_taboo",
    "public_texts",
    "quality_settings",
    "run_command",
    "run_quality",
    "scorecard",
    "secret_terms",
    "table",
    "taboo_questions",
]
