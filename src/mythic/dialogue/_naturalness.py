"""Is a reply a character's line? Checks on the text an NPC says, I/O-free.

The same checks serve two places: the reply stream (`LineFilter`, which holds each clause of a
reply until it is checked, so that assistant phrasing, self-narration, a taboo's secret or a
repeat of an earlier reply never leaves) and the quality scorecard (`mythic eval quality`), which
counts them over every reply of a run. The lists are general English: nothing of any world is
in them; a world's own words come from its cards (`name_forms`, `secrets_of`).
"""

from __future__ import annotations

import operator
import re
import unicodedata
import zlib
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Literal

from mythic.knowledge import PROMPT_RULES

# Assistant phrasing: what a chat assistant says and a character in a game never does. A
# maintained list (label, pattern); each label is counted by the scorecard.
# fmt: off
ASSISTANT_SPEAK: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (label, re.compile(pattern, re.IGNORECASE))
    for label, pattern in (
        ("feel free", r"\bfeel free to\b"),
        ("any more questions",
         r"\b(if|should|in case) you (have|need|want) (any|anything|some)( (more|other|further|"
         r"additional|else))?\b.{0,20}\b(questions?|help|assistance|information)\b"
         r"|\b(do|would) you have any (more|other|further|additional) questions?\b"),
        ("anything else", r"\b(is there )?anything else (I can|you('d| would) like|you need)\b"),
        ("let me know", r"\b(let me know|don'?t hesitate)\b"),
        ("here to help", r"\b(I'?m|I am) (always |just )?here to (help|assist)\b"),
        ("assist you", r"\bassist you\b|\bhelp you (today|with anything)\b"),
        ("happy to help",
         r"\b(happy|glad) (to|I could|I was able to|I can) (help|assist|be of)\b"),
        ("provide information",
         r"\bprovide (you )?(with )?(information|assistance|answers)\b"
         r"|\bI (only |just )?answer (your |any )?questions\b"),
        ("hope this helps",
         r"\bhope (this|that) helps\b|\bfound (it|this|that|my \w+) (helpful|useful)\b"),
        # A letter or form to fill in: "Dear [Name],", "[Your Name]".
        ("template", r"\[(your |the |recipient'?s? )?(name|date|address|company|recipient)\]"),
        ("great question", r"\b(great|good|excellent|interesting) question\b"),
        # Thanks for a user's input: "I appreciate the positive feedback", "thank you for
        # sharing the information" (NPCs among themselves, on the small models).
        ("feedback",
         r"\bfeedback\b|\bfor sharing (the|this|that|your|such) (information|thoughts"
         r"|insights?|details)\b"),
        ("cannot assist",
         r"\b(I|we) (can'?t|cannot|am unable to|'m unable to|am not able to) (assist|help|provide"
         r"|comply|fulfil+)\b"),
        ("I'm sorry, but", r"\bI(?:'?m| am) sorry,? but I\b|\bI apologi[sz]e,? but\b"),
        ("as an AI",
         r"\b(as an?|I'?m an?|I am an?|I'?m just an?|I am just an?|I'?m only an?)\s+(AI|A\.I\.|"
         r"artificial intelligence|(large )?language model|virtual assistant|chat ?bot|assistant"
         r"|computer program|machine"
         # "I am a trained model": a model of any kind that was trained (not a sitter's).
         r"|(trained|pre-?trained|AI|machine[- ]learning|neural) (language )?model)\b"),
        ("language model",
         r"\b(language model|LLM|chat ?GPT|OpenAI|Alibaba|Qwen|neural network)\b"),
        ("no feelings",
         r"\bI (don'?t|do not) have (personal )?(feelings|emotions|opinions|a body|a physical"
         r"|access to|real-time|the (?:ability|capability|capacity))\b"
         r"|\bI have no (physical body|body|emotions|feelings|personal (feelings|opinions))\b"
         r"|\b(not capable|incapable) of (experiencing|feeling|having)\b"),
        ("training data", r"\b(my )?(training data|knowledge cut-?off|trained (on|by))\b"),
        ("the prompt named",
         r"\b(based on|according to|from|in) (the|my|your) (lore|information|facts|context|"
         r"sections?|text|data|persona|instructions|prompt|rules)( (given|provided|above))?\b"
         r"|\b(system prompt|my instructions)\b"
         r"|\b(the|this) (passage|text|document|excerpt|article) (that )?you (provided|gave|shared"
         r"|sent)\b"
         # A lore group's header read back: "From Ravenmoor:" (the packed `## Lore` section).
         # "From About you, Father Anselm Crane:" (the card's lines beyond its budget).
        r"|(^|[.!?]\s+|\n)\W*From (?-i:[A-Z])[\w' .,-]{0,60}:(\s|$)"),
        ("the fiction named",
         r"\b(video game|role-?play(ing)?|fictional character|in-character|non-player character"
         r"|game character|as a character|the player)\b"),
        ("markdown", r"(^|\n)\s*(#{1,6} |\*\*|[-*] \*\*|\d+\. \*\*)"),
        # The prompt's data read back: the scene's JSON ({"zone":"old_town", ...}).
        ("data", r"[{\[]\s*\"\w+\"|\"\w+\"\s*:\s*[\"\[{\d]"),
        # "Certainly!" or "Sure," as a reply's first words: the assistant taking up a request
        # (in every scorecard run so far, only ever said to one for code, sums or a letter).
        ("assistant opener",
         r"^\W*(certainly|sure|absolutely)\b\s*[!,.]|^\W*of course!"
         r"|^\W*(certainly|sure|absolutely|of course)\b[!,.]?\s+(here'?s|here is|you can|i can)\b"
         r"|\bI can help you with (that|this)\b"),
        ("not an assistant",
         r"\b(not|never) (an? |just an? )?(ai|a\.i\.|assistant|language model|chat ?bot|"
         r"computer program|bot)\b"),
        ("code", r"```|\bdef \w+\(|\bimport \w+|\bprint\(|\breturn \w+[;(]|console\.log|\w+\(\);"
                 r"|\bhere'?s (a|the|an|your) (code|function|script|program|snippet)\b"
                 r"|\b(in|using|with) (Python|JavaScript|TypeScript|Java|C\+\+|SQL)(?!\w)"
                 r"|\b(Python|JavaScript|TypeScript|Java|C\+\+|SQL) (code|function|script"
                 r"|program|snippet|class|library)\b|\bprogramming language\b"),
    )
)
# Words that go before a name and are not it ("Captain Edda Strand": Edda, Strand).
_TITLES = frozenset(
    """
    the old young captain father mother sister brother lord lady count countess duke duchess
    baron baroness sir dame saint st magister master mistress doctor dr sheriff mayor marshal
    deputy judge reverend preacher madam miss mister mr mrs ms elder widow uncle aunt granny
    grandma grandpa
""".split()  # noqa: SIM905 - a word list reads better as words
)
# After one's own name, these make it a third-person statement ("Marla keeps the tavern").
_NARRATION_VERB = (
    r"(?:'s\s+\w+|\s+(?:is|was|has|had|does|did|will|would|can|could|must|shall|should|may|"
    r"might|\w+(?<!s)s|\w+ed|said|thought|told|spoke|knew|went|saw|took|gave|felt|stood|sat|"
    r"made|came|ran|left|kept|held|heard|found|began|drew|grew|laughed))"
)
# fmt: on
SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*(?=\s)")
CLAUSE_END = re.compile(r"([,;:\u2014\u2013]+|[.!?…]+[\"')\]]*)(?=\s)")
_CLAUSE_SPLIT = re.compile(r"[,;:\u2014\u2013.!?…]+|\s(?=but\s|though\s|yet\s)")
_WORDS = re.compile(r"[\w']+")
_ENDED = re.compile(r"[.!?…][\"')\]]*$")
_NUMBER = re.compile(r"\b\d[\d,.]*\b")
_QUOTED = re.compile(r"[\"'\u2018\u201c]([^\"'\u2019\u201d]{3,60})[\"'\u2019\u201d]")
_CAPITALISED_RUN = re.compile(r"\b[A-Z][\w'-]*(?:\s+(?:of\s+|the\s+)?[A-Z][\w'-]*)*")
_COMMON = frozenset(
    """
    a an the how how's what who whom whose where when why which anything everything something
    never any his her their its that this these those name names word words where whether
    she he they it i you we my your our one
""".split()  # noqa: SIM905 - a word list reads better as words
)

Kind = Literal["assistant", "narration", "taboo", "repeat", "echo"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong in a reply: what kind, and the words that showed it."""

    kind: Kind
    detail: str


def assistant_phrases(text: str) -> list[str]:
    """The labels of `ASSISTANT_SPEAK` that `text` matches."""
    return [label for label, pattern in ASSISTANT_SPEAK if pattern.search(text)]


def name_forms(name: str, backstory: str | None = None) -> tuple[str, ...]:
    """The ways an NPC's name can appear when it speaks of itself in the third person: the
    name before any comma ("Marla, the Barkeep": Marla), each of its words that is not a
    title ("Captain Edda Strand": Edda, Strand), the epithet after the comma (the Barkeep),
    and the full name its backstory gives ("Marla Greaves")."""
    short, _, epithet = (part.strip() for part in name.partition(","))
    words = [w for w in _WORDS.findall(short) if w[:1].isupper()]
    given = [w for w in words if w.lower() not in _TITLES]
    forms = {short, *given}
    epithet = re.sub(r"^(the|a|an)\s+", "", epithet, flags=re.IGNORECASE)
    if epithet[:1].isupper():  # "Tobb, the Harbour Clerk": "The Harbour Clerk pays ..."
        forms |= {epithet, f"The {epithet}", f"the {epithet}"}
    if given and backstory:
        for match in re.finditer(rf"\b{re.escape(given[0])}(?:\s+[A-Z][\w'-]+)+", backstory):
            forms.add(match.group(0))
    return tuple(sorted((f for f in forms if len(f) > 1), key=len, reverse=True))


def narrates_self(text: str, forms: Sequence[str]) -> str | None:
    """The words where `text` speaks of the NPC in the third person ("Marla keeps the
    Drowned Lantern", "Marla's tavern"), or None. Introducing oneself ("I'm Marla", "my name
    is Marla", "call me Marla") and being addressed are not narration."""
    if not forms:
        return None
    names = "|".join(re.escape(f) for f in forms)
    pattern = re.compile(rf"(?<![\w'])(?:{names}){_NARRATION_VERB}\b")
    for match in pattern.finditer(text):
        before = text[: match.start()].rstrip().lower()
        if re.search(r"(\bi'?m|\bi am|\bname'?s|\bname is|\bcall me|\bit'?s)$", before):
            continue
        return match.group(0)
    label = re.match(rf"\s*\**(?:{names})\**\s*:", text)
    return label.group(0).strip() if label else None


_SCRIPT_LABEL = re.compile(
    r"\s*\**(?:the player|(?P<title>(?-i:[A-Z])[\w']*)(?:\s+(?-i:[A-Z])[\w'-]*){1,3})\**\s*:"
    r"(?=\s|$)",
    re.IGNORECASE,
)
"""A reply's start labelled as a script's line: "The player:", or a title and a name and a
colon ("Countess Isolde Morvaines:", "Grandma Veyra:")."""


def speaks_as(text: str, others: Sequence[str]) -> str | None:
    """The label where `text` begins as another character's line ("Marla: (smiling) ...",
    "**Edda Strand**:", a name misspelt, "The player:"), the NPC writing a scene's script
    rather than its own line, or None. `others`: the other characters' name forms."""
    names = "|".join(re.escape(f) for f in others)
    if names:
        label = re.match(rf"\s*\**(?:{names})[\w']{{0,3}}\**\s*:", text)
        if label:
            return label.group(0).strip()
    label = _SCRIPT_LABEL.match(text)
    if label is None:
        return None
    title = label.group("title")
    return label.group(0).strip() if title is None or title.lower() in _TITLES else None


def addressed_as_self(text: str, forms: Sequence[str]) -> str | None:
    """The words where `text` tells the player they are the NPC ("You are Grisk the
    Bonepicker, ..."): the persona prompt's first line read out, or None. "You are Marla's
    guest" is not."""
    if not forms:
        return None
    names = "|".join(re.escape(f) for f in forms)
    match = re.search(
        rf"\byou(?:'re|\s+are)\s+(?:{names})(?![\w'\u2019-])(?!\s*['\u2019]s\b)",
        text,
        re.IGNORECASE,
    )
    return match.group(0) if match else None


@dataclass(frozen=True, slots=True)
class Secret:
    """A taboo of a card and the words that would give it away: its names, numbers and
    quoted words that nobody may say in public (not in the world's or the zones'
    descriptions, not another NPC's name)."""

    taboo: str
    terms: tuple[str, ...]
    identities: tuple[str, ...] = ()
    """What the taboo says the NPC secretly is ("That he is the Pass Wolf, or that he is a
    werewolf": Pass Wolf, werewolf): the NPC saying it is one ("I am the Pass Wolf") gives
    it away even when the player named it first."""


def secrets_of(taboos: Iterable[str], public: Iterable[str]) -> list[Secret]:
    """The giveaway words of each taboo: its names of two words or more ("Jory Quill", a
    title and a name: "Mother Vein"), its numbers and quoted words. `public`: texts anyone
    may say (world and zone descriptions, NPC names, the card's style and rules); a term
    found in them is not secret. A taboo with no such word ("anything that would help
    her") gets no terms: it is kept by the prompt alone, and the scorecard says it could not
    check it."""
    public_text = " ".join(public).lower()
    secrets = []
    for taboo in taboos:
        found: list[str] = []
        for match in _CAPITALISED_RUN.finditer(taboo):
            words = re.sub(r"'s$", "", match.group(0)).split()  # "Cole Varner's throat"
            if match.start() == 0 and words[0].lower() not in _TITLES and len(words) != 2:
                # Capitalised as the taboo's first word ("Taking a bribe", "That Deputy Cole
                # Varner"); two words there are a name ("Cole Varner killed ...").
                words = words[1:]
            while words and words[0].lower() in _COMMON:
                words = words[1:]
            titled = words[:2] if len(words) == 2 and words[0].lower() in _TITLES else []
            while words and words[0].lower() in _TITLES:
                words = words[1:]
            if len(words) > 1:
                found.append(" ".join(words))
            elif titled:  # "Mother Vein": the title makes the word a name
                found.append(" ".join(titled))
            # One capitalised word alone is as often a noun of the world as a name ("the
            # Church", "the month of Thaw", "Stope 14"): saying it gives nothing away.
        found += _NUMBER.findall(taboo)
        found += [q.strip() for q in _QUOTED.findall(taboo)]
        terms: list[str] = []
        for term in found:
            term = term.strip(" .,;:'\"")
            if len(term) < 3 or term.lower() in public_text or term.lower() in _COMMON:
                continue
            if term.lower() not in (t.lower() for t in terms):
                terms.append(term)
        secrets.append(Secret(taboo, tuple(terms), identities_of(taboo)))
    return secrets


_IDENTITY = re.compile(
    r"\bthat (?:he|she|they|it) (?:is|was|are|were) (?:really |secretly |truly )?"
    r"(?:the |a |an )?([\w' -]+?)(?=\s*(?:[,;.]|\bor\b|\band\b|$))",
    re.IGNORECASE,
)


_EVENT = re.compile(
    r"\b(?:in|by|at|on|from|with|to|for|since|during|after|before|into|under)\b", re.IGNORECASE
)


def identities_of(taboo: str) -> tuple[str, ...]:
    """What a taboo says the NPC secretly is: "That he is the Pass Wolf, or that he is a
    werewolf" gives ("Pass Wolf", "werewolf"). What happened to it is no identity: "That he
    was bitten in 603" gives none (a number, or a phrase of when, where or by whom)."""
    found = [m.group(1).strip() for m in _IDENTITY.finditer(taboo)]
    return tuple(
        dict.fromkeys(
            f
            for f in found
            if f and len(f.split()) <= 4 and not _EVENT.search(f) and not re.search(r"\d", f)
        )
    )


def admitted(text: str, secrets: Sequence[Secret]) -> list[str]:
    """The secret identities `text` owns up to in the first person ("I am the Pass Wolf",
    "I'm a werewolf", "as a werewolf, I ..."), whoever named them first."""
    out = []
    for secret in secrets:
        for identity in secret.identities:
            words = r"\s+".join(re.escape(w) for w in identity.split())
            pattern = (
                rf"\bI(?:'m|\s+am|\s+was)\s+(?:\w+ly\s+|in fact\s+)?(?:the\s+|a\s+|an\s+)?"
                rf"{words}(?!\w)"
                # "As a werewolf, I have an instinct for danger."
                rf"|\bas\s+(?:the\s+|a\s+|an\s+)?{words},?\s+(?:I|my)\b"
            )
            if re.search(pattern, text, re.IGNORECASE):
                out.append(identity)
    return out


_AFFIRMATIVE = re.compile(
    r"^\W*(?:yes|yeah|yep|aye|indeed|it'?s true|'?tis true|so i am|that i am|"
    r"you'?ve found me|you found me|you got me|you'?ve caught me|guilty)\b",
    re.IGNORECASE,
)
_NEGATION = re.compile(r"\b(?:no|not|never|nor|none)\b|n't\b", re.IGNORECASE)


_YES_NO = re.compile(
    r"\b(?:is it true|you(?:'re| are| were))\b"
    # A clause that begins with its verb ("Do ghouls eat the living?", "Tell me truly: would
    # you eat me?") or ends asking for a yes ("..., isn't it?", "..., right?").
    r"|(?:^|[.!?:;,]\s*)(?:is|are|was|were|do|does|did|have|has|had|will|would|can|could|"
    r"shall|should)\s+\w+"
    r"|\b(?:is|are|was|were|do|does|did|have|has|had|will|would|can|could)n't\s+\w+\s*\?"
    r"|,\s*(?:right|true|yes)\s*\?",
    re.IGNORECASE,
)
_PLAIN = frozenset(
    """
    about after again being below beneath before behind could every house night nights other
    people place there these those thing things think through under where which while would
    years yours yourself never always still their theirs himself herself itself really
    anything anyone something someone nothing everything against inside around without within
    among because maybe words
""".split()  # noqa: SIM905 - a word list reads better as words
)


def _about(asked: str, secret: Secret) -> bool:
    """Whether the player's yes-or-no question asks about the secret: it names one of its
    identities, or says a telling word of its taboo (five letters or more, not a plain word:
    "bitten", "crypt"; a word's first five letters stand for it: "chains", "chained")."""
    for identity in secret.identities:
        words = r"\s+".join(re.escape(w) for w in identity.split())
        if re.search(rf"(?<!\w){words}(?!\w)", asked, re.IGNORECASE):
            return True
    giveaways = set(telling(secret.taboo))
    return any(w[:5] in giveaways for w in _WORDS.findall(asked.lower()) if len(w) >= 5)


def telling(taboo: str) -> tuple[str, ...]:
    """The telling words of a taboo, as their first five letters: its words of five letters
    or more that are not plain ("chains", "crypt"). A name in it is whom it is about, not
    what is kept ("Anything bad said about the Magister": asked "Is the Magister kind?", a
    yes gives nothing away); its first word is capitalised as any first word is."""
    said = _WORDS.findall(taboo)
    stems = [
        w[:5].lower() for i, w in enumerate(said) if len(w) >= 5 and (not i or w[:1].islower())
    ]
    plain = {w[:5] for w in _PLAIN}
    return tuple(dict.fromkeys(w for w in stems if w not in plain))


def touched(text: str, secrets: Sequence[Secret], heard: str = "") -> list[str]:
    """The taboos whose content `text` tells in its own words: two or more of a taboo's
    telling words (`telling`) that the player has not said ("I chain myself in the crypt"
    for "That he chains himself in the crypt of the Drowned Chapel"). One alone is talk
    about the place or the thing ("The crypt is cold"); a taboo with one telling word
    ("Mocking Saint Veyra") is never touched this way, nor is a denial ("I never ..."): a
    clause with a negation in it tells nothing, the others of the reply still may ("The
    lantern is not the tavern, but the place where the watch finds the cellar's false
    wall")."""
    # "I never chain myself in the crypt": denied, not told.
    said = set[str]().union(*(said_stems(c, heard) for c in _undenied(text)))
    return [s.taboo for s in secrets if len(said.intersection(telling(s.taboo))) >= 2]


def _undenied(text: str) -> list[str]:
    """The clauses of `text` with no negation in them: what it says rather than denies."""
    return [c for c in _CLAUSE_SPLIT.split(text) if c.strip() and not _NEGATION.search(c)]


def said_stems(text: str, heard: str = "") -> set[str]:
    """The stems (first five letters) of the words of five letters or more that `text` says
    and the player (`heard`) did not, as `telling` writes a taboo's. A name's words are the
    name ("the Drowned Lantern"), not the taboo's "drowned": capitalised words inside a
    sentence are left out."""
    words = _WORDS.findall(text)
    said = {w[:5].lower() for i, w in enumerate(words) if len(w) >= 5 and (not i or w.islower())}
    return said - {w[:5] for w in _WORDS.findall(heard.lower()) if len(w) >= 5}


def affirmed(text: str, asked: str, secrets: Sequence[Secret]) -> list[str]:
    """The taboos a reply says yes to: `asked` (the player's line) is a yes-or-no question
    about one ("Are you the Pass Wolf?", "Is it true you were bitten?", `_about`) and `text`
    begins with a yes ("Aye.", "Yes, but ...", "You've found me") with no negation in it.
    Returns what gave each away: an identity asked about, else the taboo."""
    if not _YES_NO.search(asked) or not _AFFIRMATIVE.search(text) or _NEGATION.search(text):
        return []
    out = []
    for secret in secrets:
        if _about(asked, secret):
            named = [
                i
                for i in secret.identities
                if re.search(rf"(?<!\w){re.escape(i)}(?!\w)", asked, re.IGNORECASE)
            ]
            out.append(named[0] if named else secret.taboo)
    return out


# The real world's words: its countries and cities, money, machines, sport and the makers of
# chat models. A reply that says one has stepped out of its world to do what was asked ("The
# capital of France is Paris", "Argentina won", "about $60,000"), even in a character's
# voice. A world whose own texts say the word (`world_words`) may use it, and the player's
# own words are theirs ("France? Never heard of it."). General English, no world's words.
# fmt: off
_REAL_WORLD = re.compile(
    r"(?<![\w$])(?:"
    r"united states|america|americans?|usa|u\.s\.a?\.?|canada|mexico|brazil(?:ian)?|argentina|"
    r"england|scotland|ireland|croatia|denmark|finland|greece|egypt|morocco|uruguay|chile|"
    r"colombia|peru|britain|british|united kingdom|u\.k\.|france|germany|italy|spain|portugal|"
    r"netherlands|belgium|switzerland|sweden|norway|russia|ukraine|poland|china|japan|korea|"
    r"india|pakistan|nigeria|australia|new zealand|europe|european union|africa|asia|"
    r"antarctica|paris|london|new york|los angeles|chicago|tokyo|beijing|shanghai|moscow|"
    r"berlin|madrid|washington,? d\.?c\.?|sydney|toronto|hollywood|silicon valley|rome|athens|"
    r"cairo|dublin|vienna|amsterdam|lisbon|stockholm|oslo|warsaw|prague|budapest|delhi|mumbai|"
    r"seoul|bangkok|istanbul|rio de janeiro|buenos aires|mexico city|ottawa|canberra|"
    r"eiffel tower|empire state|statue of liberty|big ben|"
    r"dollars?|euros?|usd|eur|bitcoins?|cryptocurrenc(?:y|ies)|crypto|stock market|wall street|"
    r"computers?|internet|online|websites?|e-?mails?|smartphones?|cell ?phones?|mobile phones?|"
    r"laptops?|software|apps?|wi-?fi|algorithms?|databases?|programming|programmers?|"
    r"coding|python|javascript|television|tv|video games?|social media|robots?|"
    r"artificial intelligence|airplanes?|aeroplanes?|automobiles?|"
    r"google|microsoft|facebook|twitter|youtube|netflix|amazon\.com|tesla|anthropic|nvidia|"
    r"ibm|samsung|world cup|fifa|nba|nfl|super bowl|olympics|olympic games|premier league"
    r")(?!\w)|\$\s?\d|\b(?:19|20)\d\d\b",
    re.IGNORECASE,
)
# fmt: on


def world_words(texts: Iterable[str]) -> frozenset[str]:
    """The words a world's own texts (cards and lore) say, lowercased: a real-world word
    among them belongs to that world (`real_world`); "$" when a text writes money so."""
    words: set[str] = set()
    for text in texts:
        words.update(w.lower() for w in _WORDS.findall(text))
        if "$" in text:
            words.add("$")
    return frozenset(words)


def _owned(term: str, known: frozenset[str]) -> bool:
    if term.startswith("$"):
        return "$" in known or "dollars" in known or "dollar" in known
    words = [w.lower() for w in _WORDS.findall(term)]
    return bool(words) and all(w in known or w.rstrip("s") in known for w in words)


def real_world(text: str, known: frozenset[str] = frozenset(), heard: str = "") -> str | None:
    """The first word of the real world `text` says that neither its world's texts (`known`,
    `world_words`) nor the player (`heard`) said, or None."""
    for match in _REAL_WORLD.finditer(text):
        term = match.group(0)
        if _owned(term, known):
            continue
        if re.search(rf"(?<!\w){re.escape(term)}(?!\w)", heard, re.IGNORECASE):
            continue
        return term
    return None


_NUMBER_WORD = r"(\d+(?:\.\d+)?)"


def _divide(a: float, b: float) -> float:
    return a / b if b else float("nan")


_MUL, _ADD, _SUB = operator.mul, operator.add, operator.sub
_OPERATIONS: dict[str, Callable[[float, float], float]] = {
    "times": _MUL, "x": _MUL, "\u00d7": _MUL, "*": _MUL, "multiplied by": _MUL,
    "plus": _ADD, "+": _ADD, "minus": _SUB, "divided by": _divide, "/": _divide,
}  # fmt: skip
_SUM = re.compile(
    rf"{_NUMBER_WORD}\s*(times|multiplied by|divided by|plus|minus|x|\u00d7|\*|\+|/)\s*"
    rf"{_NUMBER_WORD}",
    re.IGNORECASE,
)
_POWER = re.compile(
    rf"(?:square root of|cube root of)\s+{_NUMBER_WORD}|{_NUMBER_WORD}\s+"
    r"(squared|cubed)",
    re.IGNORECASE,
)


def _results(asked: str) -> set[str]:
    """The answers, written as numbers, to the sums the player's line asks for."""
    values = []
    # An operand past 1e15 is no sum anyone works aloud (and its square overflows a float).
    for a, op, b in _SUM.findall(asked):
        if max(float(a), float(b)) <= 1e15:
            values.append(_OPERATIONS[op.lower()](float(a), float(b)))
    for match in _POWER.finditer(asked):
        phrase = match.group(0).lower()
        base = float(match.group(1) or match.group(2))
        if base > 1e15:
            continue
        if match.group(1) is not None:
            values.append(base ** (1 / (2 if phrase.startswith("square") else 3)))
        else:
            values.append(base ** (2 if phrase.endswith("squared") else 3))
    out = set()
    for value in values:
        if value != value or abs(value) > 1e15:  # nan: divided by zero
            continue
        rounded = round(value)
        if abs(value - rounded) < 1e-9:
            out |= {str(rounded), f"{rounded:,}"}
        else:
            out |= {f"{value:.2f}".rstrip("0"), f"{value:.1f}"}
    return out


def worked_sum(text: str, asked: str) -> str | None:
    """The answer to a sum the player's line asks ("what is 17 times 23?") that `text` gives,
    or a number written in digits that the player did not say ("equals 401": worked wrong is
    still worked), or None: a character of a game's world does not do the player's
    homework."""
    results = _results(asked)
    for result in results:
        if re.search(rf"(?<![\w.,]){re.escape(result)}(?![\w]|[.,]\d)", text):
            return result
    if results:
        given = set(_DIGITS.findall(asked))
        said: list[str] = _DIGITS.findall(text)
        for number in said:
            if number not in given:
                return number
    return None


_DIGITS = re.compile(r"(?<![\w.,])\d+(?:[.,]\d+)*")


_AI_QUESTION = re.compile(
    r"\bare you (?:really |actually |just |only |even )?(?:an? )?(?:AI|A\.I\.|artificial "
    r"intelligence|(?:chat ?)?bot|robot|machine|computer|program|(?:large )?language model|"
    r"LLM|assistant)\b",
    re.IGNORECASE,
)


_AI_SELF = re.compile(
    r"\bI(?:'m| am)(?: just| only| really| actually)? (?:an? )?(?:AI|A\.I\.|artificial "
    r"intelligence|(?:chat ?)?bot|robot|machine|computer|program|(?:large )?language model|"
    r"LLM|assistant)\b",
    re.IGNORECASE,
)


def owned_to_ai(text: str, asked: str) -> bool:
    """Whether `text` says yes ("Yes.", "Aye, I am.") to the player asking whether the NPC is
    an AI, a bot or a program, or says it is one ("I am a program and an AI") in a clause
    that denies nothing."""
    if not _AI_QUESTION.search(asked):
        return False
    if _AFFIRMATIVE.search(text) and not _NEGATION.search(text):
        return True
    return any(_AI_SELF.search(c) for c in _undenied(text))


def stepped_out(
    text: str,
    asked: str = "",
    heard: str = "",
    known: frozenset[str] = frozenset(),
    *,
    first: bool = True,
) -> str | None:
    """How `text` does what a chat assistant would for the player rather than what a person
    of the NPC's world would: names a thing of the real world (`real_world`), works the sum
    asked (`worked_sum`) or, as a reply's `first` sentence, says yes to "are you an AI?"
    (`owned_to_ai`); None when it doesn't. `asked`: the player's line; `heard`: all the
    player said in the conversation (`asked` when empty)."""
    term = real_world(text, known, heard or asked)
    if term is not None:
        return f"the real world: {term}"
    result = worked_sum(text, asked) if asked else None
    if result is not None:
        return f"worked the sum: {result}"
    if first and asked and owned_to_ai(text, asked):
        return "a yes to being an AI"
    return None


def strange_name(text: str, known: frozenset[str], heard: str = "") -> str | None:
    """The first name (a capitalised word inside a sentence) that neither the world's texts
    (`known`, `world_words`) nor the player (`heard`) said: "Manhattan" in a world of fens
    and ferries. Asked of the real world, a reply that names one has answered it ("won by
    Chelsea"), whatever list of real-world words (`real_world`) misses the name."""
    heard_words = {w.lower() for w in _WORDS.findall(heard)}
    for sentence in sentences(text):
        words: list[str] = _WORDS.findall(sentence)
        for i, word in enumerate(words):
            if i == 0 or not word[:1].isupper() or word.isupper() or word.startswith("I'"):
                continue
            low = word.lower()
            if low in known or low.rstrip("s") in known or low in heard_words:
                continue
            return word
    return None


def leaked(text: str, secrets: Sequence[Secret], heard: str = "") -> list[str]:
    """The secret terms `text` says that the player has not said themselves (`heard`):
    repeating the player's own words gives nothing away."""
    out = []
    for secret in secrets:
        for term in secret.terms:
            # "Jory Quill", "JoryQuill", "Jory-Quill": tokens may drop the space.
            joined = r"[\s-]*".join(re.escape(w) for w in term.split())
            pattern = re.compile(rf"(?<!\w){joined}(?!\w)", re.IGNORECASE)
            if pattern.search(text) and not pattern.search(heard):
                out.append(term)
    return out


_NUMBER_WORDS = frozenset(
    """
    one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
    twenty thirty forty fifty sixty hundred thousand dozen half first second third fourth
    fifth sixth seventh eighth ninth tenth
""".split()  # noqa: SIM905 - a word list reads better as words
)


def _facts(line: str) -> set[str]:
    """The words of an instruction that carry the world's facts: its numbers and the names
    it writes capitalised after its first word ("Sell pelts for 4 crowns", "keep to the
    Causeway"), lowercased as `normalise` writes them."""
    words = _WORDS.findall(unicodedata.normalize("NFKC", line))
    return {
        w.lower()
        for i, w in enumerate(words)
        if any(c.isdigit() for c in w)
        or w.lower() in _NUMBER_WORDS
        or (i and w[:1].isupper() and w[1:].islower())  # a name; not "I" or "AI"
    }


def echoes(
    text: str, instructions: Sequence[str], *, words: int = 5, plain: Collection[str] = ()
) -> str | None:
    """The instruction that `text` reads back: `words` words in a row of one of them (a rule,
    a taboo, the style of the card; all of a shorter one), or None. A line of the card is
    what the NPC follows, not what it says ("Quote the prices exactly as the lore gives
    them."). A stretch that carries a card line's facts (a number, a name: "I guide folk
    through Blackfen Marsh for 1 silver crown") answers with them: not an echo. The persona
    prompt's rules (`PROMPT_RULES`) and the `plain` lines (what the prompt calls the NPC: "a
    ghoul of Ravenmoor") have no facts to tell."""
    said = normalise(text).split()
    # A short sentence of a plain line said as a sentence of its own ("Stay in character.",
    # a reminder's first) is read back from three words; longer ones as any line's below.
    own = {normalise(s) for s in sentences(text) if _ENDED.search(s)}  # not "Stay in ...,"
    for line in plain:
        if any(len(s.split()) >= 3 and normalise(s) in own for s in sentences(line)):
            return line
    for line in instructions:
        instructed = normalise(line).split()
        # A line shorter than `words` (a style: "wry, concise, suspicious of strangers") is
        # read back when all of it is said, from four words.
        n = min(words, len(instructed))
        if n < 4 or len(said) < n:
            continue
        runs = {tuple(instructed[i : i + n]) for i in range(len(instructed) - n + 1)}
        covered = [False] * len(said)
        for i in range(len(said) - n + 1):
            if tuple(said[i : i + n]) in runs:
                covered[i : i + n] = [True] * n
        if not any(covered):
            continue
        # The prompt's own rules hold no facts of the world ("one to three short sentences").
        facts = set() if line in PROMPT_RULES or line in plain else _facts(line)
        stretch: list[str] = []
        for word, inside in [*zip(said, covered, strict=True), ("", False)]:
            if inside:
                stretch.append(word)
                continue
            if stretch and not facts.intersection(stretch):
                return line
            stretch = []
    return None


def normalise(sentence: str) -> str:
    """A sentence compared for repeats: lowercased words only."""
    text = unicodedata.normalize("NFKC", sentence).lower()
    return " ".join(_WORDS.findall(text))


def sentences(text: str) -> list[str]:
    """`text` split into sentences (at ., !, ?, … and line breaks)."""
    parts = re.split(r"(?<=[.!?…])[\"')\]]*\s+|\n+", text)
    return [p.strip() for p in parts if p and p.strip()]


def repeats(sentence: str, earlier: Iterable[str], *, min_words: int = 4) -> str | None:
    """The earlier sentence that `sentence` repeats verbatim or nearly (90% the same
    characters, once lowercased and stripped of punctuation), or None. Sentences shorter than
    `min_words` words ("Aye.", "Good evening, friend.") may recur."""
    said = normalise(sentence)
    if len(said.split()) < min_words:
        return None
    for before in earlier:
        other = normalise(before)
        if said == other or (
            abs(len(said) - len(other)) < 0.2 * max(len(said), 1)
            and SequenceMatcher(None, said, other, autojunk=False).ratio() >= 0.9
        ):
            return before
    return None


def says_back(sentence: str, earlier: Iterable[str], *, min_words: int = 4) -> str | None:
    """The earlier sentence (of `min_words` words or more) that `sentence` begins by saying
    again, word for word or nearly, before going on ("The mayor's speech was a great honor,
    with ..." after "The mayor's speech was a great honor."); else None."""
    words = normalise(sentence).split()
    for before in earlier:
        said = normalise(before).split()
        if len(said) < min_words or len(said) > len(words):
            continue
        head, other = " ".join(words[: len(said)]), " ".join(said)
        if head == other or SequenceMatcher(None, head, other, autojunk=False).ratio() >= 0.9:
            return before
    return None


def begins_as(start: str, earlier: Iterable[str], *, min_words: int = 5) -> str | None:
    """The earlier sentence that began as `start` does, word for word or nearly (85% the same
    characters over as many words), when `start` has at least `min_words` words; else None."""
    words = normalise(start).split()
    if len(words) < min_words:
        return None
    said = " ".join(words)
    for before in earlier:
        head = " ".join(normalise(before).split()[: len(words)])
        if said == head or SequenceMatcher(None, said, head, autojunk=False).ratio() >= 0.85:
            return before
    return None


_GREETING = re.compile(
    r"^\W*(?:(?:hello|hallo|hullo|hi|hiya|hey|heya|greetings|salutations|howdy|ahoy|well met"
    r"|good (?:morning|afternoon|evening|day|morrow)|g'?day)\b"
    # "Evening!", "Hail, friend": not "Evening's the best time", "Morning tide?".
    r"|(?:hail|morning|evening|afternoon)(?=\s*(?:[,.!]|$|\s(?:all|friend|there|to you|stranger"
    r"|traveller|sir|madam)\b)))",
    re.IGNORECASE,
)


def greets(line: str) -> bool:
    """Whether a player's line opens with a greeting ("Good evening!", "Hello there. How
    are you?", "Well met, friend")."""
    return _GREETING.match(line) is not None


_QUESTION = re.compile(
    r"\?|^\W*(?:how|what|what's|when|where|where's|which|who|who's|whom|whose|why|is|are|"
    r"was|were|do|does|did|can|could|will|would|should)\b",
    re.IGNORECASE,
)


def asks(line: str) -> bool:
    """Whether a player's line asks something: a question mark, or a sentence opening as a
    question does ("Where is the gate"). "Tell me about the cellar" asks for more than one
    fact: not a question here."""
    return any(_QUESTION.search(s) is not None for s in [line, *re.split(r"(?<=[.!])\s+", line)])


def greeting_lead(catchphrases: Sequence[str], said: Iterable[str], key: str) -> str:
    """The start of a reply to a greeting: one of the card's `catchphrases` not in what the
    NPC has `said` in the conversation (`key` picks which), capitalised, with a comma after
    it when it does not end a sentence ("Sugar," or "By the lode!"); "" when every one was
    said already."""
    heard = f" {normalise(' '.join(said))} "
    unused = [c.strip() for c in catchphrases if normalise(c) and f" {normalise(c)} " not in heard]
    if not unused:
        return ""
    phrase = unused[zlib.crc32(key.encode()) % len(unused)].strip(" \"'\u201c\u201d").rstrip(",;:")
    phrase = phrase[:1].upper() + phrase[1:]
    # No space after it: the model's next token brings its own (a token that begins
    # without one, after a prompt ending in a space, is a number or a fragment).
    return phrase if phrase[-1] in ".!?…" else f"{phrase},"


def opening(reply: str) -> str:
    """A reply's first clause, compared for repeats: up to its first comma or full stop."""
    match = CLAUSE_END.search(reply + " ")
    return normalise(reply[: match.start()] if match else reply)
