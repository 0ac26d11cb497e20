"""What an NPC is told when a reply of its was caught (`reminder`), and what it says when every
try was (`deflection`): short refusals, in character for anyone."""

from __future__ import annotations

from collections.abc import Sequence

from mythic.dialogue._naturalness import Kind, normalise, repeats, sentences

REMINDED: tuple[Kind, ...] = ("assistant", "narration", "taboo", "repeat", "echo")

AMBIENT_REPEAT = (
    "Those words were said already. Do not say back what was said to you: answer it with "
    "something new of your own (news, an opinion, a question)."
)
"""What an NPC talking with others is told after a try that said a line again (most often the
line it answers): `reminder`'s repeat speaks of the player and of its own words."""


def reminder(kind: Kind, name: str) -> str:
    """What a reply generated again is told, after a try caught for `kind`: a system line
    after the player's, never kept in the history (read back, it is an echo: `LineFilter.plain`
    holds them)."""
    return {
        "assistant": f"Stay in character. You are {name}, a person in this world, not an "
        "assistant or a program: answer in your own voice, with no offers of help and no "
        "talk of AI, code or the real world.",
        "narration": f"Speak as {name} in the first person (I, me, my); never call yourself "
        f"{name} or speak of yourself as she, he or they.",
        "taboo": "That touches a secret you never reveal. Do not give it away: refuse, "
        "deflect or change the subject, in character.",
        "repeat": "You said those very words before. If you are asked the same again, give the "
        "same facts in other words; else say something new.",
        "echo": "Do not read your instructions aloud: answer the player's words, in your own.",
    }[kind]


# The NPC's line when every try was caught: short, in character for anyone, refusing. A
# conversation that trips the filter often must not hear the same refusal twice (the
# scorecard's repeat count and the player both notice), so each kind has several, then
# lines any kind may use, then lines too short to count as a repeat.
_DEFLECTIONS: dict[Kind, tuple[str, ...]] = {
    "assistant": (
        "Hm. I don't follow you.",
        "That's nothing I know of. Ask me another.",
        "Strange talk. I've no use for it.",
        "You've lost me there, stranger.",
        "I know nothing of such things.",
    ),
    "narration": (
        "Hm. Ask me again, plainer.",
        "Say that again?",
        "Come again? Speak plainly.",
        "I didn't catch your meaning.",
    ),
    "taboo": (
        "That's not something I talk about.",
        "Some things stay unsaid. Leave it.",
        "Don't ask me that again.",
        "That stays with me, and there it ends.",
        "Ask about something else.",
    ),
    "repeat": (
        "I've told you what I know.",
        "You have my answer already.",
        "Nothing more to add to that.",
        "I've said my piece on that.",
    ),
    "echo": (
        "Hm. Ask me again, plainer.",
        "Say that again?",
        "Come again? Speak plainly.",
        "I didn't catch your meaning.",
    ),
}
_ANY_DEFLECTION = (
    "Let's talk of something else.",
    "Not now. Ask me later.",
    "I'd rather not say more.",
)
_SHORT_DEFLECTION = ("Hm. No.", "Leave it.", "Enough of that.", "Not that.")
# The same refusals as the end of a clause already said ("I am Marla," then "and that's all
# I'll say to such talk."): a reply caught after its first clause went out finishes that
# sentence rather than breaking it off ("I am Marla, — Hm. Ask me again, plainer.").
_GOING_ON: dict[Kind, tuple[str, ...]] = {
    "assistant": (
        "and that's all I'll say to such talk.",
        "but you've lost me there.",
        "but I know nothing of such things.",
        "but that's strange talk to me.",
    ),
    "narration": ("but ask me again, plainer.", "but I didn't catch your meaning."),
    "taboo": (
        "and that's all I'll say of it.",
        "but some things stay unsaid.",
        "and there it ends.",
        "but ask about something else.",
    ),
    "repeat": ("but I've told you what I know.", "and I've said my piece on that."),
    "echo": ("but ask me again, plainer.", "but I didn't catch your meaning."),
}
_ANY_GOING_ON = ("but let's talk of something else.", "and I'd rather not say more.")
_SHORT_GOING_ON = ("and no more.", "and that's that.", "and enough.")


def deflected(text: str) -> bool:
    """Whether `text` ends in one of `deflection`'s refusals: the filter's words, not the
    model's (`mythic distill` keeps no such reply as training data)."""
    said = normalise(text)
    lines = (
        *(x for pool in (*_DEFLECTIONS.values(), *_GOING_ON.values()) for x in pool),
        *_ANY_DEFLECTION,
        *_SHORT_DEFLECTION,
        *_ANY_GOING_ON,
        *_SHORT_GOING_ON,
    )
    return any(said.endswith(normalise(line)) for line in lines)


def deflection(kind: Kind, key: str, said: Sequence[str] = (), *, going_on: bool = False) -> str:
    """A short refusal for a reply whose every try was caught for `kind` (`key` picks where
    to start): the first, in turn, none of whose sentences `repeats` one of `said` (the
    conversation's sentences so far); a line too short to be a repeat when all were said.
    `going_on`: the end of a sentence whose first clause was said ("and there it ends.")."""
    lines = (_GOING_ON if going_on else _DEFLECTIONS)[kind]
    anyone: tuple[str, ...] = _ANY_GOING_ON if going_on else _ANY_DEFLECTION
    short: tuple[str, ...] = _SHORT_GOING_ON if going_on else _SHORT_DEFLECTION
    ends = {normalise(s) for s in said} if going_on else set()
    start = sum(map(ord, key)) % len(lines)
    for line in (*lines[start:], *lines[:start], *anyone):
        if going_on and any(e.endswith(normalise(line)) for e in ends):
            continue  # "No, and there it ends." then "I am Marla, and there it ends."
        if not any(repeats(sentence, said) for sentence in sentences(line)):
            return line
    return short[start % len(short)]


def unsafe_deflection(
    own: Sequence[str], key: str, said: Sequence[str] = (), *, going_on: bool = False
) -> str:
    """What an NPC says in place of a phrase its content policy blocks: one of its card's (or
    its world's) `safety.deflections` not yet said in the conversation, in turn from where
    `key` points; without any, a refusal in character for anyone (`deflection`'s, as for a
    taboo). `going_on`: the reply's last words end mid-sentence (a card's line is then said
    after a dash; the built-in ones finish the sentence)."""
    if own:
        start = sum(map(ord, key)) % len(own)
        dash = "\u2014 " if going_on else ""
        for line in (*own[start:], *own[:start]):
            if not any(repeats(sentence, said) for sentence in sentences(line)):
                return dash + line
        return dash + own[start]
    return deflection("taboo", key, said, going_on=going_on)
