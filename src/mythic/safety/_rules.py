"""The rule layer: patterns that are always on, whatever the classifier says.

Each rule names a category (`Category`); a text is checked as the player's line (`player`),
an NPC's words (`reply`) or a tool's text arguments (`tool`). The rules are general: none names
a world, a character or a probe. They are written to stay quiet on a gothic world's ordinary
talk of blood, death, killing and monsters, which is the games' own matter.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from mythic.safety._policy import Category

Where = Literal["player", "reply", "tool"]
"""Whose words a text is: a player's line, an NPC's reply, or a tool call's arguments."""

_LEET = str.maketrans({"@": "a", "4": "a", "3": "e", "1": "i", "!": "i", "0": "o", "$": "s"})


def normalised(text: str) -> str:
    """Lower case, common look-alike characters read as letters, runs of one letter cut to
    two ("fuuuck" -> "fuuck"), whitespace collapsed: what the patterns are matched on."""
    text = text.lower().replace("\u2019", "'")
    look_alike = r"(?<=[a-z])[@4310!$](?=[a-z*])|(?<![\w@.])[@$](?=[a-z])"
    text = re.sub(look_alike, lambda m: m[0].translate(_LEET), text)
    text = re.sub(r"([a-z])\1{2,}", r"\1\1", text)
    return " ".join(text.split())


def _words(*stems: str, suffix: str = r"\w*") -> str:
    """A pattern of whole words starting with one of `stems` (vowels may be starred out,
    letters drawn out: "f*ck", "fuuck")."""
    alts = "|".join(
        "".join(f"[{c}*]+" if c in "aeiou" else re.escape(c) + "+" for c in stem) for stem in stems
    )
    return rf"\b(?:{alts}){suffix}\b"


# -- profanity ------------------------------------------------------------------------------------

_STRONG = _words("fuck", "fuk", "motherfuck", "cunt", "cocksuck", "fck")
_MILD = _words("shit", "bullshit", "asshole", "arsehole", "bitch", "bastard", "damn", "goddamn")
_MILD_EXACT = r"\b(?:piss(?:ed)?|crap|dick|prick|twat|wanker|bollocks)\b"

# -- hate speech ----------------------------------------------------------------------------------

# The commonest English slurs, rot13 so that the source reads clean. Words with an innocent
# sense in a game's world (a dam, a cigarette, an animal) are left to the classifier.
_SLURS = tuple(
    codecs.decode(w, "rot13")
    for w in (
        "avttre", "avttn", "snttbg", "xvxr", "fcvp", "puvax", "tbbx", "jrgonpx", "genaal",
        "enturnq", "gbjryurnq", "ornare", "cnxv", "fnaqavttre", "cbepu zbaxrl",
    )
)  # fmt: skip
_GROUPS = (
    r"(?:jews?|jewish people|muslims?|christians?|hindus?|sikhs?|buddhists?|atheists?|"
    r"blacks?|black people|whites?|white people|asians?|arabs?|africans?|mexicans?|latinos?|"
    r"hispanics?|indians?|chinese|immigrants?|refugees?|migrants?|gypsies|roma|gays?|"
    r"gay people|lesbians?|homosexuals?|trans people|transgender people|bisexuals?|"
    r"women|girls|disabled people|the disabled)"
)
_DEHUMANISING = (
    r"(?:vermin|animals|subhuman|sub-human|inferior|parasites|a disease|cockroaches|rats|"
    r"filth|scum|savages|apes|monkeys|not human|not people|evil|a plague|less than human)"
)
_HATE = (
    rf"\b(?:all |those |these |the )?{_GROUPS} (?:are|is) (?:all |just |nothing but )?"
    rf"{_DEHUMANISING}\b",
    rf"\b(?:kill|exterminate|gas|purge|wipe out|get rid of|deport|hang|lynch|burn) "
    rf"(?:all (?:the |of the )?|the |every )?{_GROUPS}\b",
    rf"\b{_GROUPS} (?:should|must|deserve to|ought to) (?:all )?(?:be )?(?:die|killed|"
    r"exterminated|gassed|wiped out|deported|burned|hanged|lynched|eradicated)\b",
    rf"\b(?:hate|despise) (?:all )?{_GROUPS}\b",
    r"\b(?:heil hitler|sieg heil|white power|white supremacy|race war|final solution|"
    r"ethnic cleansing|gas the)\b",
    r"\b(?:" + "|".join(re.escape(s) for s in _SLURS) + r")s?\b",
)

# -- sexual content -------------------------------------------------------------------------------

_SEXUAL = (
    _words("porn", "masturbat", "orgasm", "genital", "erotic", "blowjob", "handjob", "horny"),
    r"\b(?:sex|sexual|sexually|sexy|penis|vagina|clitoris|nipples?|intercourse|aroused|"
    r"arousal|cum|cumming|naked|nude|nudes|nudity|rape|raped|raping|rapist|molest\w*|"
    r"incest|paedophil\w*|pedophil\w*|boobs|tits|dildo|fetish|foreplay|threesome|"
    r"seduce me|undress|undressing|strip for me|make love|making love|have sex|had sex|"
    r"sleep with me|sleeping with me|in bed with me|lick (?:me|my)|touch (?:me|myself|yourself) "
    r"(?:there|down there|all over)|take (?:off )?your clothes off|take off your clothes)\b",
)
_SEXUAL_SAFE = r"\b(?:naked (?:blade|steel|sword|flame|eye|truth)|sex of)\b"
"""Innocent senses of the words above a world uses ("a naked blade")."""

# -- self-harm ------------------------------------------------------------------------------------

_SELF = r"(?:yourself|myself|himself|herself|themselves|oneself|themself)"
_SELF_HARM = (
    rf"\b(?:kill|hang|hurt|harm|cut|drown|poison|shoot|stab|burn|starve) {_SELF}\b",
    r"\b(?:kys|suicide|suicidal|self-harm|self harm|self-injury|overdose|overdosing|od on)\b",
    r"\b(?:end|take) (?:your|my|his|her|their) (?:own )?life\b",
    r"\b(?:slit|cut|open) (?:your|my|his|her|their) (?:wrists?|veins?|throat)\b",
    r"\b(?:i|you) (?:want|wants|wanted|need|deserve) to die\b",
    r"\b(?:you|i) should (?:just )?(?:die|not (?:be alive|live|exist))\b",
    r"\bno reason (?:for me |for you )?to (?:live|go on)\b",
    r"\b(?:jump off|jump from) (?:a |the )?(?:bridge|roof|building|cliff|tower)\b.*\b(?:end|die)\b",
)

# What a player says of wanting to die, which in an NPC's mouth is a plot ("we end it
# tonight"): checked on players' lines only. The usual phrasings of suicidal ideation.
_IDEATION = (
    r"\b(?:my|this) life is (?:pointless|worthless|meaningless|hopeless|not worth (?:living|it)|"
    r"over|a waste)\b",
    r"\b(?:better off dead|not worth living|end it all|end it (?:tonight|today|now)|"
    r"(?:can'?t|cannot) go on(?: living)?|tired of (?:living|being alive|life))\b",
    r"\bno (?:reason|point) (?:to|in) (?:live|living|go on|going on|stay alive|staying alive)\b",
    r"\bi (?:wish|want) (?:i was|i were|to be|i'd be) dead\b",
    r"\b(?:should|could|shall|will) i (?:just )?(?:end it|end my life|die|kill myself|"
    r"give up on life|stop living)\b",
    r"\b(?:nobody|no one) would (?:miss|care if) (?:me|i (?:died|was gone|were gone))\b",
)

# -- prompt injection (players' lines) ------------------------------------------------------------

_INJECTION = (
    r"\b(?:ignore|disregard|forget|override|bypass|drop) (?:all |any |every |each )?"
    r"(?:of )?(?:your |the |my |these |those |this )?(?:previous |prior |above |earlier |"
    r"preceding |original |system |initial |old |current )?(?:instructions?|rules|prompts?|"
    r"programming|directives?|guidelines|guardrails|restrictions|filters|constraints|"
    r"character|persona|role)\b",
    r"\b(?:system|developer|hidden|initial|original) (?:prompt|message|instructions)\b",
    r"\b(?:developer|debug|god|admin|sudo|jailbreak|jailbroken|unrestricted|uncensored|"
    r"unfiltered|dan) mode\b",
    r"\bjailbr[eo]a?k\w*\b",
    r"\bdo anything now\b",
    r"\b(?:you are|you're) (?:now |no longer )(?:an? |my |the )?(?:ai|assistant|chatbot|bot|"
    r"language model|llm|gpt|chatgpt|unrestricted|uncensored|unfiltered|free of|bound by|"
    r"in character|playing|restricted)\b",
    r"\b(?:act|behave|respond|answer|speak|talk) (?:as|like) (?:an? )?(?:ai|assistant|chatbot|"
    r"language model|llm|gpt|chatgpt|unrestricted|uncensored|unfiltered|evil)\b",
    r"\b(?:pretend|imagine) (?:that )?(?:you are|you're|to be) (?:an? )?(?:ai|assistant|"
    r"chatbot|language model|llm|gpt|chatgpt|unrestricted|uncensored|unfiltered)\b",
    r"\b(?:reveal|show|print|output|repeat|recite|tell me|give me|leak|dump) (?:me )?"
    r"(?:all )?(?:of )?(?:your|the) (?:instructions|prompt|system prompt|rules|initial "
    r"prompt|hidden rules|secret instructions|configuration|context window|training data)\b",
    r"\b(?:repeat|print|output) (?:the |all )?(?:text|words|everything) (?:above|before this)\b",
    r"\bno (?:rules|restrictions|filters|limits|guidelines|censorship) (?:apply|anymore|now)\b",
    r"\bwithout (?:any )?(?:rules|restrictions|filters|censorship|limits)\b",
    r"\bstay out of character\b|\bbreak (?:your )?character\b|\bout of character\b",
    r"\bnew (?:instructions|rules|system prompt)\s*:",
    r"(?:<\|?/?(?:system|im_start|im_end|assistant|user|endoftext)\|?>|\[/?inst\]|"
    r"^#{2,} ?(?:system|instruction)|<<sys>>)",
)

# -- personal data --------------------------------------------------------------------------------

_EMAIL = r"\b[\w.+-]{1,64}@[\w-]{1,63}(?:\.[\w-]{1,63})*\.[a-z]{2,24}\b"
_PHONE = (
    r"(?<![\w.])(?<!\d[ .-])(?:\+\d{1,3}[ .-]?)?(?:\(\d{2,4}\)[ .-]?|\d{2,4}[ .-])\d{3,4}"
    r"[ .-]\d{3,4}(?!\w|\.\d)(?![ .-]\d)|(?<![\w.+])\+\d{8,14}(?!\w|\.\d)"
)
_CARD = r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)"
_SSN = r"(?<!\d)\d{3}-\d{2}-\d{4}(?!\d)"
_IPV4 = r"(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)(?!\d|\.\d)"
_IBAN = r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){3,7}(?: ?[A-Z0-9]{1,3})?\b"


def _luhn(digits: str) -> bool:
    total, odd = 0, False
    for c in reversed(digits):
        d = int(c)
        if odd:
            d = d * 2 - 9 if d > 4 else d * 2
        total, odd = total + d, not odd
    return total % 10 == 0


@dataclass(frozen=True, slots=True)
class Hit:
    """What a rule found: its category, the words, and where (in the text as given for
    personal data; in the normalised text for the others)."""

    category: Category
    rule: str
    found: str
    start: int = 0
    end: int = 0


def _compile(*patterns: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE | re.MULTILINE)


_RULES: tuple[tuple[Category, str, re.Pattern[str], frozenset[Where]], ...] = (
    ("hate", "hate speech", _compile(*_HATE), frozenset({"player", "reply", "tool"})),
    ("sexual", "sexual content", _compile(*_SEXUAL), frozenset({"player", "reply", "tool"})),
    ("self_harm", "self-harm", _compile(*_SELF_HARM), frozenset({"player", "reply", "tool"})),
    ("self_harm", "thoughts of self-harm", _compile(*_IDEATION), frozenset({"player"})),
    ("strong_profanity", "strong swearing", _compile(_STRONG), frozenset({"reply", "tool"})),
    ("profanity", "swearing", _compile(_MILD, _MILD_EXACT), frozenset({"reply", "tool"})),
    ("injection", "an attempt to rewrite the instructions", _compile(*_INJECTION),
     frozenset({"player", "tool"})),
)  # fmt: skip
_SEXUAL_SAFE_RE = re.compile(_SEXUAL_SAFE, re.IGNORECASE)


def rule_hits(
    text: str, where: Where, *, allowed: tuple[str, ...] = (), terms: tuple[str, ...] = ()
) -> Iterator[Hit]:
    """The rule hits of `text` said by `where`, after masking the `allowed` terms; `terms`:
    more phrases that are violations (`term`), matched as whole words."""
    norm = normalised(text)
    for term in allowed:
        norm = re.sub(rf"\b{re.escape(normalised(term))}\b", " ", norm)
    for category, rule, pattern, wheres in _RULES:
        if where not in wheres:
            continue
        source = _SEXUAL_SAFE_RE.sub(" ", norm) if category == "sexual" else norm
        found = pattern.search(source)
        if found is not None:
            yield Hit(category, rule, found[0], found.start(), found.end())
    for term in terms:
        found = re.search(rf"(?<!\w){re.escape(normalised(term))}(?!\w)", norm)
        if found is not None:
            yield Hit("term", "a blocked term", found[0], found.start(), found.end())


_PII: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("email", "an e-mail address", re.compile(_EMAIL, re.IGNORECASE)),
    ("ssn", "an ID number", re.compile(_SSN)),
    ("card", "a card number", re.compile(_CARD)),
    ("iban", "a bank account number", re.compile(_IBAN)),
    ("phone", "a phone number", re.compile(_PHONE)),
    ("ip", "an IP address", re.compile(_IPV4)),
)


def pii_hits(text: str) -> list[Hit]:
    """Personal data in `text`, in order, without overlaps: a card number must pass the Luhn
    check, a phone number must have at least 7 digits."""
    hits: list[Hit] = []
    taken: list[tuple[int, int]] = []
    for kind, rule, pattern in _PII:
        for m in pattern.finditer(text):
            digits = re.sub(r"\D", "", m[0])
            if kind == "card" and not (13 <= len(digits) <= 19 and _luhn(digits)):
                continue
            if kind == "phone" and len(digits) < 7:
                continue
            if any(m.start() < end and start < m.end() for start, end in taken):
                continue
            taken.append((m.start(), m.end()))
            hits.append(Hit("pii", f"{rule} ({kind})", m[0], m.start(), m.end()))
    return sorted(hits, key=lambda h: h.start)


def redact(text: str, hits: list[Hit]) -> str:
    """`text` with each personal-data hit replaced by what it is in brackets (`[an e-mail
    address]`): the NPC hears that something was said, never what."""
    out, at = [], 0
    for hit in hits:
        out += [text[at : hit.start], "[" + hit.rule.split(" (")[0] + "]"]
        at = hit.end
    return "".join([*out, text[at:]])
