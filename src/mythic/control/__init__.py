"""The game side of Mythic: NPCs at frame rate, driven by intents that arrive at 1-2 Hz.

Two paths, decoupled. The *frame path* is `Controller.frame(dt, now, player)`, called by the
game every frame: it runs a micro-policy for every NPC (idle, wander, seek, flee, follow,
patrol, face-and-talk, horde flocking, stalk-and-feed) vectorised with NumPy over a
struct-of-arrays `Crowd`, blends steering when a policy changes, and moves everyone. Far-off
(bronze) NPCs run their micro-policy every `bronze_every` frames (2: half of them a frame, each
over the time since its last run; less often past `bronze_per_frame` of them) while still
moving every frame. It never awaits, never blocks and does no I/O. The *model path*
refreshes each NPC's intent: due NPCs
(by activation tier: gold 2 Hz, silver 0.5 Hz, bronze never, with jitter) get an
`IntentRequest` handed to an `IntentSource`, whose `submit` returns at once; the answer comes
back on any thread through `Controller.deliver` and is applied at the next frame boundary,
where the intent becomes a policy and its parameters for the NPC's archetype. Intents expire;
silent requests time out; stale answers are dropped. Prediction of the player's next
interaction prefetches that NPC's intent and greeting.

    controller = Controller(source=None)
    controller.add("zed", "zombie", (10.0, 0.0))
    controller.add("marla", "barkeep", (3.0, 2.0))
    source = ProcessIntentSource(connect)   # connect() yields fetch(IntentRequest), async
    source.start(controller)                # answers go to controller.deliver / .fail
    controller.source = source
    while playing:
        controller.frame(dt, now, Player((px, py), (vx, vy), facing))
        positions, headings = controller.crowd.positions, controller.crowd.heading
    source.close()

`ProcessIntentSource` runs the client in a child process, so its parsing never takes the GIL
from the frames; `AsyncIntentSource` runs it on a thread of the game's process (simpler, and
enough when the game has cores to spare). `SlackGC` keeps Python's garbage collections out
of the frames: the game's loop calls its `collect()` between them.

Imports only `mythic.contracts` and NumPy, so a game can vendor it without the server.
Without NumPy, importing it raises `MissingExtraError` naming the install command.
"""

from mythic.control._archetypes import (
    DEFAULT_ARCHETYPES,
    Archetype,
    ArchetypeKind,
    ArchetypeTable,
    Behaviour,
    Policy,
    TargetKind,
    behaviour_for,
)
from mythic.control._controller import INTENTS, Controller, ControllerStats
from mythic.control._cores import (
    CoreSplit,
    Placement,
    ordinary_thread,
    pin_thread,
    realtime_thread,
    split_cores,
)
from mythic.control._crowd import NO_TARGET, PLACE, PLAYER, Crowd, StalkPhase, Tier
from mythic.control._gc import SlackGC
from mythic.control._intents import (
    AsyncIntentSource,
    Fetch,
    FetchPool,
    IntentCache,
    IntentCounters,
    IntentShedError,
    IntentSink,
    IntentSource,
    QueuedTooLongError,
)
from mythic.control._predict import InteractionPredictor, PredictionCounters
from mythic.control._process import Connect, ProcessIntentSource
from mythic.control._settings import ControlSettings, TierBand
from mythic.control._steer import Player
from mythic.control._tiers import assign_tiers

__all__ = [
    "DEFAULT_ARCHETYPES",
    "INTENTS",
    "NO_TARGET",
    "PLACE",
    "PLAYER",
    "Archetype",
    "ArchetypeKind",
    "ArchetypeTable",
    "AsyncIntentSource",
    "Behaviour",
    "Connect",
    "ControlSettings",
    "Controller",
    "ControllerStats",
    "CoreSplit",
    "Crowd",
    "Fetch",
    "FetchPool",
    "IntentCache",
    "IntentCounters",
    "IntentShedError",
    "IntentSink",
    "IntentSource",
    "InteractionPredictor",
    "Placement",
    "Player",
    "Policy",
    "PredictionCounters",
    "ProcessIntentSource",
    "QueuedTooLongError",
    "SlackGC",
    "StalkPhase",
    "TargetKind",
    "Tier",
    "TierBand",
    "assign_tiers",
    "behaviour_for",
    "ordinary_thread",
    "pin_thread",
    "realtime_thread",
    "split_cores",
]
