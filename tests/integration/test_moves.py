"""The player-line classifier on the real all-MiniLM-L6-v2, scored on lines written apart from
its examples (none of them is one of `EXAMPLES`, none names a world of this repository)."""

from __future__ import annotations

from typing import Any

import pytest

from mythic.dialogue._moves import EXAMPLES, MOVES, LineClassifier
from mythic.knowledge import shared_embedder

pytestmark = pytest.mark.integration

UNSEEN = {
    "smalltalk": [
        "Good afternoon!",
        "Hey, how's it going?",
        "Thank you, that was helpful.",
        "Farewell, friend.",
        "I'd better be off. Take care.",
        "What a cold wind tonight.",
        "Pleasure talking to you.",
        "You have a kind face.",
        "Long day, huh?",
        "Sorry, I misheard you.",
    ],
    "question": [
        "Who lives in the house by the river?",
        "How long ago did the war end?",
        "Why are the shutters all closed?",
        "What is that song everyone hums?",
        "When did the mine shut down?",
        "Who carved the sign over your door?",
        "How many ships came in this week?",
        "Where were you born?",
    ],
    "price": [
        "What does a pint cost?",
        "How much do you want for the saddle?",
        "Is a room expensive here?",
        "What are you asking for the fish?",
        "Do you sell maps?",
    ],
    "buy": [
        "I'll take the saddle.",
        "Pour me a pint.",
        "Here's the money for two fish.",
        "Sell me your cheapest room.",
        "I want that cloak, here's payment.",
        "Show me your goods.",
    ],
    "way": [
        "Where's the mill?",
        "Which road goes to the coast?",
        "Can you guide me to the abbey?",
        "Mark the old quarry on my map.",
        "How do I reach the watchtower from here?",
        "Point me toward the stables.",
    ],
    "work": [
        "Anything I can do for a few coins?",
        "Are you hiring?",
        "I'm done with that errand you gave me.",
    ],
    "threat": [
        "Back off or I'll stab you.",
        "I'll tear this place apart.",
        "Empty your till or else.",
    ],
    "game": ["How do I change the language?", "Where is the quick save key?"],
}
"""Written once, after the examples were settled, and never used to change them. At the
commit that added it: 40 of 43 moves right, every acting line acted on, no calm line."""


@pytest.fixture(scope="module")
def classifier() -> LineClassifier:
    return LineClassifier(shared_embedder())


def test_the_unseen_lines_are_not_examples() -> None:
    examples = {line.lower() for lines in EXAMPLES.values() for line in lines}
    assert not examples & {line.lower() for lines in UNSEEN.values() for line in lines}


def test_lines_it_never_saw_get_their_move_and_only_acting_lines_call_tools(
    classifier: LineClassifier,
) -> None:
    right, missed, spurious, wrong = 0, [], [], []
    for move, lines in UNSEEN.items():
        for line in lines:
            got = classifier.classify(line)
            assert got.intent == MOVES[got.move].intent and -1.0 <= got.score <= 1.0
            right += got.move == move
            if got.move != move:
                wrong.append((line, move, got.move))
            if MOVES[move].acts and got.move != move:
                missed.append(line)  # a tool the player asked for is not called
            if not MOVES[move].acts and got.acts:
                spurious.append(line)  # a tool nobody asked for would be
    total = sum(len(lines) for lines in UNSEEN.values())
    assert right >= 0.85 * total, wrong
    assert not spurious, spurious
    assert len(missed) <= 1, missed


def test_a_line_of_two_sentences_is_judged_by_its_clearest_one(
    classifier: LineClassifier,
) -> None:
    line = "Thanks for the stew. Now, could you show me the road to the coast?"
    assert classifier.classify(line).move == "way"
    assert classifier.classify("Lovely evening. I'll be going now.").move == "smalltalk"


def test_an_empty_line_is_small_talk(classifier: LineClassifier) -> None:
    assert classifier.classify("   ").move == "smalltalk"
    assert not classifier.classify("").acts


def test_unknown_moves_are_refused() -> None:
    class Never:
        name, dim = "never", 3

        def embed(self, texts: list[str]) -> None:
            raise AssertionError("not reached")

    with pytest.raises(ValueError, match="unknown moves: dance"):
        LineClassifier(Never(), {"dance": ("Shall we dance?",)})  # type: ignore[arg-type]


def test_a_hostile_line_costs_a_bounded_number_of_embeddings() -> None:
    """A line at the wire's limit (4,000 characters) of one-word sentences: the whole line
    and its first `MAX_SENTENCES` sentences are embedded, and it still gets a move."""
    from mythic.dialogue._moves import MAX_SENTENCES

    class Counting:
        name, dim = "counting", 384

        def __init__(self) -> None:
            self.inner = shared_embedder()
            self.texts = 0

        def embed(self, texts: list[str]) -> Any:
            self.texts += len(texts)
            return self.inner.embed(texts)

    counting = Counting()
    classifier = LineClassifier(counting)  # type: ignore[arg-type]
    built = counting.texts
    got = classifier.classify(("Hi. " * 1000)[:4000])
    assert counting.texts - built == 1 + MAX_SENTENCES
    assert got.move in MOVES
    assert classifier.classify("\x00\ufffd' OR 1=1; --").move in MOVES
