"""`dialogue`: NPC actors' turns, intents and tool calls."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from mythic.config._section import Section


class DialogueSettings(Section):
    """NPC actors: turns, intents and tool calls (technical design, sections 5 and 11)."""

    max_concurrent_speakers: int = Field(default=2, ge=1, le=1024)
    """NPCs speaking at once; another NPC's reply waits, thinking, until one finishes. A reply
    holds its slot while its words are generated, not while its per-line decision or a game
    tool's round trip runs (a tool's voiced result takes a slot again)."""

    mailbox_size: int = Field(default=32, ge=1, le=4096)
    """Player lines and intent requests waiting per NPC; more are refused (`npc_busy`)."""

    decide: bool = True
    """Classify each player line (intent) and let the NPC call a game tool, while the reply
    streams."""

    decider: Literal["classifier", "model"] = "classifier"
    """How a line's intent and tool are decided. `classifier`: its nearest labelled example
    lines on the sentence embedder retrieval uses (milliseconds, no engine slot; the model
    only writes the item of a `give_item`), the tool's target a place the line names;
    `model`: a constrained gold request on the intent model. Measured on the held-out world
    with the 0.5B model, `model` got 24 of 34 actions right (actions_coldiron_model.json in
    bench/results; docs/guides/characters.md, "Actions"). Without the
    embedder (the `rag` extra), `model`."""

    decision_max_tokens: int = Field(default=64, ge=8, le=512)
    """Token cap of an intent or tool decision."""

    tool_timeout_s: float = Field(default=3.0, gt=0, le=300)
    """How long the first `ToolCall` waits for the game's `Ack` before it is sent again."""

    tool_retries: int = Field(default=2, ge=0, le=10)
    """How many times an unanswered `ToolCall` is sent again (same call_id), each wait twice
    the previous; then the turn goes on with `TOOL_TIMEOUT`."""

    tool_voice: Literal["template", "model"] = "template"
    """How the NPC voices a tool's result after the game's `Ack`: `template`, a fixed line per
    tool ("I've marked the Old Town on your map."), at once; `model`, a short reply generated
    from the result. Measured on the 0.5B default model, `model` often read the game's result
    note back verbatim; use it with a bigger dialogue model."""

    spoken_max_sentences: int = Field(default=3, ge=0, le=100)
    """A reply to a line the player said aloud (voice) ends with its this-many-th sentence:
    the model is stopped there (0: no limit; typed lines end at `chat.max_tokens`). Spoken,
    a 200-token reply is a minute of speech that holds one of `max_concurrent_speakers` and
    the engine; the prompt asks for one to three short sentences, which a small model does
    not always keep to."""

    phrase_min_s: float = Field(default=0.2, ge=0, le=5)
    """Reply text buffered before a sentence is handed to speech synthesis."""

    phrase_max_s: float = Field(default=0.4, ge=0, le=5)
    """Reply text buffered before a clause is handed to speech synthesis."""

    first_phrase_words: int = Field(default=6, ge=0, le=64)
    """A reply's first sentence, when it runs past this many words before a comma or a full
    stop, is handed to speech synthesis in two: its first words (at most this many, cut
    before a word like "and" or "where", or after one a phrase can end on), then the rest.
    The player hears the NPC as soon as those words are synthesised: Piper took 134 ms for 7
    words and 325 ms for 18 on one core, and the model need not generate the whole sentence
    first. 0 waits for the first comma or full stop; else at least 3."""

    preempt_spoken_lines: bool = True
    """Start the reply to a spoken line before the player's turn has surely ended: from the
    transcript of their words up to a pause, when the turn model has said "not yet" or has
    not said (`speech.turn_detector`). Nothing of the reply leaves the server until the final
    transcript says the same words; if the player goes on speaking, or the words differ, it
    is dropped without a trace (counted: `mythic_voice_preempted_total{outcome}`)."""

    prefill_while_speaking: bool = True
    """While the player is still speaking, compute the reply's prompt from their partial
    transcript: the session's memory, the lore retrieved for the words so far, and the KV of
    everything before their line (one-token requests on the dialogue tier). The lore is
    evaluated in parts of `prepare_step_tokens`, most relevant first; a later partial that
    retrieves other lore goes on with its lines. None is prepared before a partial has
    `prepare_min_words` words. When the player stops, a part still being evaluated is
    stopped (what it evaluated stays cached): a spoken line's reply tells the lore prepared
    by then and at most `more_lore_tokens` more, so its first token never waits for more
    lore than that, whatever the machine's speed. A warm-up counts as a dialogue request in
    `/v1/usage`. Right after each reply, too, a session whose next line would overflow the
    context has its prompt window moved and evaluated then, while the player listens (a
    one-token request). Off: nothing is prepared, and a spoken line tells all its lore."""

    prepare_step_tokens: int = Field(default=96, ge=0, le=4096)
    """The parts, in tokens (4 characters each), in which a prompt prepared while the player
    speaks evaluates its lore: the reply has the parts finished when the player stops. On
    2 CPU cores beside the speech recogniser a part of 96 tokens took 1.3-1.7 s (on a slow
    day of the project's VM). 0: the whole lore in one part."""

    prepare_batch_tokens: int = Field(default=16, ge=1, le=4096)
    """Prompt tokens a part prepared while the player speaks evaluates per model step
    (`GenerationRequest.step_tokens`). When the player stops, the part's step under way
    finishes before the reply's prompt can start (a llama.cpp step cannot end early without
    losing it): short steps bound that wait. On 2 CPU cores (Qwen2.5 0.5B) a step of 16
    tokens took 150 ms at 84% of a long step's speed; one of 96 tokens, the whole part in one
    step when nothing else runs, about 750 ms."""

    prepare_min_words: int = Field(default=3, ge=1, le=100)
    """Words a partial transcript needs before the reply's prompt is prepared from it: the
    lore retrieved for "Is the" is no guide to the line, and later partials only extend it."""

    more_lore_tokens: int = Field(default=64, ge=0, le=4096)
    """A spoken line's lore beyond what was prepared while the player spoke (or its whole
    lore, when nothing was) is cut to about this many tokens (4 characters each), most
    relevant first: every one of them is evaluated after the player stops speaking. A
    prompt is prepared with room for them and the line. The later partials of a line may add
    this much lore to `knowledge.lore_tokens` in the prepared prompt."""

    line_filter: bool = True
    """Check each clause of a reply before it leaves (`mythic.dialogue.LineFilter`): assistant
    phrasing ("feel free to ask", "as an AI"), stepping out of the world to do what was asked
    (a real-world word the world and the player never said, the player's sum worked), the NPC
    speaking of itself in the third person,
    a taboo's giveaway words (its card's names and numbers that are not public), a line of
    its card read back and a sentence the NPC already said in the conversation are never
    sent. A clause is released at its comma
    or full stop, when a phrase buffer would hand it to speech anyway, so a clean reply's first
    phrase is not delayed. A reply caught before it said anything is generated again (with a
    reminder of what went wrong, sampled); one caught later is cut there."""

    regenerate_tries: int = Field(default=2, ge=0, le=8)
    """Times a reply caught by `line_filter` before its first words is generated again; when
    every try is caught, the NPC says a short in-character refusal instead."""

    answer_line: bool = False
    """A question (not a greeting) is followed, after the player's line, by the lore line
    retrieved as its best answer when that line shares a word with it
    (`mythic.knowledge.answer_line`): the small default model reads one fact told last more
    reliably than the same fact among twenty lines. Not kept in the history. Off until it is
    measured on a world it was not tried on (docs/guides/characters.md)."""

    greet_with_catchphrase: bool = True
    """A reply to a greeting ("Good evening!", "Hello there") begins with one of the card's
    catchphrases that the NPC has not yet said in the conversation ("Sugar, ..."), and the
    model goes on from it: the player meets the character its card describes. Once every
    catchphrase was said in a conversation, greetings are answered freely."""

    @field_validator("first_phrase_words")
    @classmethod
    def _first_phrase_words_zero_or_three(cls, value: int) -> int:
        if 0 < value < 3:  # PhraseBuffer's minimum: a phrase of 1-2 words says nothing
            raise ValueError(f"must be 0 (off) or at least 3, not {value}")
        return value
