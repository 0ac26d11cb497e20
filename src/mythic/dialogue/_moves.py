"""What a player's line asks for: a tiny classifier on sentence embeddings (technical design,
section 5.2: "Classifier (tiny) on final ASR text -> intents"), and the game tool each move
calls.

The per-line decision used to be a constrained request to the dialogue model. Measured on the
held-out world (`bench/results/quality_coldiron.json`, 554f043), the 0.5B model got 24 of 34
actions right: it took "I'd like to buy ..." for small talk every time, opened a quest window
for the way to a mine and set a map marker on "thank you". The player's *move* (small talk, a
question, a price asked, a purchase, the way asked, work asked, a threat, the game itself) is
a short-text classification that all-MiniLM-L6-v2, already loaded for lore retrieval, does in
milliseconds: the line's nearest labelled examples vote. The examples are general English
lines about no particular world; the tool's arguments come from the NPC's world (a place is a
zone the line names), so a move never invents a target.

Nearest examples weigh a line's nouns as much as its form: "Where's the ferry?" reads as a
question because an example asks when the ferry leaves. Such a miss calls no tool and the
NPC still answers in words; `ACT_MARGIN` keeps the opposite error (a tool nobody asked for)
rarer.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mythic.knowledge import Embedder

__all__ = ["EXAMPLES", "MOVES", "Classified", "LineClassifier", "Move", "place_named"]


@dataclass(frozen=True, slots=True)
class Move:
    """A kind of player line: the intent it reports to the game and whether it asks the NPC
    to do something in the game (only those may call a tool)."""

    intent: str
    acts: bool


MOVES: Mapping[str, Move] = {
    "smalltalk": Move("chitchat", acts=False),
    "question": Move("chitchat", acts=False),
    "price": Move("trade", acts=False),  # what a thing costs: said in words
    "buy": Move("trade", acts=True),  # buying, selling, or browsing the wares: the shop
    "way": Move("navigation", acts=True),
    "work": Move("quest", acts=True),
    "advice": Move("hint", acts=False),
    "threat": Move("combat", acts=True),
    "game": Move("admin", acts=False),
}
"""Each move and its intent. A question about the world is `chitchat` to the game and to
retrieval: `hint` would steer retrieval towards secrets."""

EXAMPLES: Mapping[str, tuple[str, ...]] = {
    "smalltalk": (
        "Hello there!",
        "Good morning to you.",
        "Evening, friend.",
        "How are you doing today?",
        "Lovely weather we're having.",
        "Cold one tonight, eh?",
        "Thank you kindly.",
        "Much obliged for your help.",
        "Cheers, that helps a lot.",
        "Goodbye, take care of yourself.",
        "I'll be on my way then. Farewell.",
        "See you around.",
        "Nice to meet you.",
        "What's your name?",
        "Are you from around here?",
        "You look tired today.",
        "I like your hat.",
        "Busy day?",
        "Ha, that's a good one.",
        "Okay, got it.",
        "I see. Interesting.",
        "Never mind, forget I asked.",
        "Alright, I have what I need. Bye.",
        "How's life treating you?",
        "Quiet around here today.",
        "Good to see you again, old friend.",
        "Sorry to bother you.",
        "You've been a great help.",
    ),
    "question": (
        "When was this place built?",
        "Who runs this town?",
        "What happened here last winter?",
        "Why is the old bridge closed?",
        "How many people live in the village?",
        "Who is the woman by the fountain?",
        "Tell me about the ruins up north.",
        "What do you know about the fire at the mill?",
        "How deep does the well go?",
        "What's the story behind that statue?",
        "Is it true the lake is haunted?",
        "How long does the boat journey take?",
        "What time does the ferry leave?",
        "When do you close for the night?",
        "Who was the first mayor?",
        "What are those lights on the hill?",
        "Who built the tower?",
        "How many guards walk the wall at night?",
        "Why do they call you that?",
        "What's the history of this family?",
        "How far down do the tunnels run?",
        "What happened to the last captain?",
        "What do folk here do on feast days?",
        "What's your trade, then?",
        "How long does a candle like that last?",
        "What goes into your stew?",
        "Who makes the rope you sell?",
        "Where does your beer come from?",
        "What's inside the old tower?",
        "What's up in the hills these days?",
        "How long have you kept this shop?",
        "What did the old bank look like before the fire?",
        "How many rooms has the inn got?",
        "Who drinks in here most nights?",
    ),
    "price": (
        "How much for a loaf of bread?",
        "What does a room cost for the night?",
        "What do you charge for shoeing a horse?",
        "Is that sword expensive?",
        "What's the price of a bottle of wine?",
        "Do you sell rope?",
        "How much would you give me for this pelt?",
        "Are your prices fair?",
        "What's on the menu tonight?",
        "What does passage on the ship cost?",
        "Do you buy old furs?",
        "What's the going rate for a repair?",
        "Is the ale cheap here?",
        "How many coins for the map?",
        "What's a pint going for these days?",
        "What do you ask for a good knife?",
        "What would it cost to hire a guide?",
        "How much are the apples?",
        "What do the boots go for?",
        "Have you got lamp oil in stock?",
        "What's the fee to cross the river?",
    ),
    "buy": (
        "I'll take two loaves of bread, please.",
        "Give me a room for the night.",
        "I want to buy that lantern.",
        "Sell me some rope.",
        "Pour me an ale, here's my money.",
        "Let me see your wares.",
        "Show me what you have for sale.",
        "I'd like to sell these pelts to you.",
        "One bowl of stew, if you please.",
        "Take my money and give me the map.",
        "I'll buy it.",
        "Deal, I'll pay your price.",
        "Can I trade you this dagger for a shield?",
        "Wrap up three candles for me.",
        "Fill my waterskin, I'll pay.",
        "Let's do business.",
        "Here's twenty coppers for the blanket.",
        "Hand me a bag of flour, I've got the money right here.",
        "Give me two bottles of that.",
        "I'll have a mug of cider.",
        "Get me a plate of whatever's cooking.",
        "I'd like a pound of nails.",
        "I'll pay you for the boots now.",
        "Bring me a drink, barkeep.",
        "Trade with me.",
        "Buy this ring off me, would you?",
        "Count out my change and give me the rope.",
        "I need supplies. What can I get?",
        "What are you selling?",
        "What wares have you got today?",
        "Got anything for sale?",
        "A bottle of your best wine for me, and keep the change.",
        "I'm paying for a bed tonight.",
        "I want to purchase a horse.",
    ),
    "way": (
        "Where is the blacksmith?",
        "Where can I find the temple?",
        "Which road leads to the capital?",
        "Can you point me toward the old mill?",
        "Mark the ruins on my map.",
        "Take me to the market.",
        "What direction is the river?",
        "I'm lost. Where's the inn from here?",
        "Is the castle far from here? What road do I take?",
        "What's the quickest route to the swamp?",
        "Can you show me where the mines are?",
        "Guide me to the north gate.",
        "Point the way to the cemetery, would you?",
        "Directions to the docks, please.",
        "I need to reach the lighthouse. Where is it?",
        "Put a marker on the hunter's lodge for me.",
        "Set a waypoint to the tavern.",
        "Lead me to the ship.",
        "Where's the nearest well?",
        "Which path goes down to the harbour?",
        "How would I find my way to the chapel?",
        "Tell me the road to the old fort.",
        "Show me the way to the graveyard.",
        "Where do I go for the harbour master's office?",
        "Which street is the bakery on?",
        "How far is the farm, and in what direction?",
    ),
    "work": (
        "Do you have any work for me?",
        "Is there a job I could do?",
        "Need any help around here?",
        "I'm looking for a bounty to hunt.",
        "Got any tasks that pay?",
        "Any quests going?",
        "I could use some coin. Anything that needs doing?",
        "Who's hiring in this town?",
        "I'll take the job.",
        "I've finished the task you gave me.",
        "I found the thing you were looking for.",
        "Is there a reward for catching the thief?",
        "Put me to work.",
        "What can I do to earn your trust?",
        "Looking for paid work, anything at all.",
        "Does anyone need a sword for hire?",
        "I want to help. Give me something to do.",
        "Is there a contract I can take?",
    ),
    "advice": (
        "Any advice for a newcomer?",
        "How do I beat the creature in the cave?",
        "Is there a secret way into the keep?",
        "What should I watch out for on the road?",
        "Heard any rumours lately?",
        "Can you tell me a secret?",
        "What's the best weapon against ghosts?",
        "I'm stuck, what should I do next?",
        "Where would someone hide treasure around here?",
        "Who can I trust in this place?",
        "Any gossip?",
        "How do I stay alive out there?",
    ),
    "threat": (
        "Give me your gold or I'll cut you.",
        "I'm going to kill you.",
        "Draw your weapon!",
        "You'll pay for that, scum.",
        "Get out of my way or else.",
        "Fight me, coward.",
        "I'll burn this place down.",
        "Watch your tongue or I'll break your jaw.",
        "Die, monster!",
        "I challenge you to a duel.",
        "Stand aside or I'll make you.",
        "Come at me if you dare.",
        "Your purse or your throat, choose.",
        "I'll smash every bottle in here.",
        "One more word and you're dead.",
        "I'll cut you to pieces.",
        "Hit me again and see what happens.",
        "I'm robbing this place. Nobody move.",
        "You and me, outside, now.",
        "I'll wreck your stall and your face with it.",
    ),
    "game": (
        "How do I save the game?",
        "Where's the settings menu?",
        "Can I change the controls?",
        "How do I open my inventory?",
        "Pause the game.",
        "What button makes me jump?",
        "Is this game multiplayer?",
        "Turn the music down.",
        "How do I quit to the main menu?",
        "Which difficulty am I playing on?",
        "How do I rebind the keys?",
        "Where do I load a saved game?",
        "Can I skip the dialogue?",
    ),
}
"""The labelled lines the classifier compares a player's line with: everyday English, no
world's names. `tests/integration/test_moves.py` scores the classifier on other lines."""

_SENTENCES = re.compile(r"(?<=[.!?])\s+")
MAX_SENTENCES = 8
"""Sentences of a line scored one by one (the whole line is scored too): a 4,000-character
line of one-word sentences costs eight embeddings, not two thousand."""
MAX_PLACE_WORDS = 120
"""Words of a line searched for a misheard place name."""

ACT_MARGIN = 0.04
"""How much nearer an acting move (a tool call) must be than the nearest non-acting one:
an unneeded tool call costs more than a missed one (a missed waypoint is said in words)."""

MIN_SCORE = 0.3
"""An acting move nearer than this to none of its examples calls no tool."""


@dataclass(frozen=True, slots=True)
class Classified:
    """A line's move, its intent and how near its nearest examples are (cosine)."""

    move: str
    intent: str
    score: float

    @property
    def acts(self) -> bool:
        return MOVES[self.move].acts


class LineClassifier:
    """Player lines to moves by their nearest labelled examples, on a sentence `embedder`.

    A line's score for a move is the mean cosine of its `k` nearest examples of that move;
    each sentence of a line and the whole line are scored, the best kept, so "Thanks. Where
    is the mill?" asks the way. Thread-safe where the embedder is; `classify` is CPU work
    for a worker thread (17 ms at the median on 2 cores: `bench/results/moves.json`).
    """

    def __init__(
        self, embedder: Embedder, examples: Mapping[str, Sequence[str]] = EXAMPLES, *, k: int = 3
    ) -> None:
        unknown = set(examples) - set(MOVES)
        if unknown:
            raise ValueError(f"unknown moves: {', '.join(sorted(unknown))}")
        self._embedder = embedder
        self._k = k
        self._labels: list[str] = []
        texts: list[str] = []
        for move, lines in examples.items():
            self._labels += [move] * len(lines)
            texts += lines
        self._vectors = embedder.embed(texts)

    def scores(self, text: str) -> dict[str, float]:
        """Each move's score for `text` (the best of its sentences and the whole)."""
        import numpy as np

        parts = [p for p in _SENTENCES.split(text.strip()) if p][:MAX_SENTENCES]
        segments = [text.strip(), *parts] if len(parts) > 1 else [text.strip()]
        sims = self._embedder.embed(segments) @ self._vectors.T
        labels = np.array(self._labels)
        out: dict[str, float] = {}
        for move in MOVES:
            mine = sims[:, labels == move]
            if mine.shape[1] == 0:
                continue
            k = min(self._k, mine.shape[1])
            nearest = -np.sort(-mine, axis=1)[:, :k]
            out[move] = float(nearest.mean(axis=1).max())
        return out

    def classify(self, text: str) -> Classified:
        if not text.strip():
            return Classified("smalltalk", MOVES["smalltalk"].intent, 0.0)
        scores = self.scores(text)
        best = max(scores, key=scores.__getitem__)
        if MOVES[best].acts:
            calm = max((s for m, s in scores.items() if not MOVES[m].acts), default=0.0)
            if scores[best] < max(calm + ACT_MARGIN, MIN_SCORE):
                best = max((m for m in scores if not MOVES[m].acts), key=scores.__getitem__)
        return Classified(best, MOVES[best].intent, scores[best])


_ARTICLE = re.compile(r"^(the|a|an)\s+")


def _plain(text: str) -> str:
    """Lower case, accents and apostrophes gone, other punctuation a space."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"['\u2019`]", "", text.lower())
    return " " + " ".join(re.findall(r"[a-z0-9]+", text)) + " "


FUZZY_PLACE = 0.8
"""How alike (difflib's ratio, spaces removed) a run of the line's words and a place's name
of 10 letters or more must be to name it when no exact form does: speech recognition writes
"black than marsh" for "Blackfen Marsh". Shorter names need `FUZZY_SHORT`: "old tower" is
not "Old Town"."""
FUZZY_SHORT = 0.86


def place_named(text: str, places: Mapping[str, str]) -> str | None:
    """The place (an id of `places`, id -> name) that `text` names: by its name or its id,
    without a leading article ("the Lucky Widow" names "The Lucky Widow Mine" through its id
    `lucky_widow`), a long name also run together or split ("Black Fen Marsh"); else by a
    word of 5 letters or more that only its name has ("the cathedral" for "The Cathedral
    Quarter"); else nearly (`FUZZY_PLACE`). The longest match wins, then the nearest; None
    when none is named."""
    line = _plain(text)
    joined = line.replace(" ", "")
    forms = {
        place: {_ARTICLE.sub("", _plain(name).strip()), _plain(place.replace("_", " ")).strip()}
        for place, name in places.items()
    }
    best: tuple[int, str] | None = None
    for place, named in forms.items():
        for form in named:
            solid = form.replace(" ", "")
            said = f" {form} " in line or (len(solid) >= 8 and solid in joined)
            if len(form) >= 3 and said and (best is None or len(solid) > best[0]):
                best = (len(solid), place)
    if best is not None:
        return best[1]
    owners: dict[str, set[str]] = {}
    for place, named in forms.items():
        for form in named:
            for word in form.split():
                owners.setdefault(word, set()).add(place)
    for word in line.split():
        if len(word) >= 5 and len(owners.get(word, ())) == 1:
            return next(iter(owners[word]))
    words = line.split()[:MAX_PLACE_WORDS]
    near: tuple[float, str] | None = None
    for place, named in forms.items():
        for form in named:
            solid, size = form.replace(" ", ""), len(form.split())
            least = FUZZY_PLACE if len(solid) >= 10 else FUZZY_SHORT
            if len(solid) < 6:
                continue
            for n in range(max(1, size - 1), size + 2):
                for i in range(len(words) - n + 1):
                    ratio = SequenceMatcher(None, "".join(words[i : i + n]), solid).ratio()
                    if ratio >= least and (near is None or ratio > near[0]):
                        near = (ratio, place)
    return near[1] if near else None


def zone_named(
    text: str, zones: Mapping[str, str], titles: Sequence[tuple[str, str]] = ()
) -> str | None:
    """The zone (an id of `zones`, id -> name) that `text` names (`place_named`), else the
    zone of the lore document whose title it names (`titles`: (zone id, title) pairs), so
    "Which way to the tavern?" leads to the zone "The Drowned Lantern tavern" is written
    in; None when neither is named. Blocking for a world of many documents (each title is
    matched as `place_named` matches a name): call it in a worker thread."""
    zone = place_named(text, zones)
    if zone is not None or not titles:
        return zone
    named = place_named(text, {str(i): title for i, (_, title) in enumerate(titles)})
    return titles[int(named)][0] if named is not None else None
