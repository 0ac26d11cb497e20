"""Archetype chains: per archetype, the LoRA adapter of each task and the servers hosting it,
with the errors of the registry that keeps them. Only `SERVED_TASKS` are applied to requests.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from mythic._errors import MythicError

if TYPE_CHECKING:
    pass

DEFAULT_MAX_TOTAL_RANK = 64
"""The rank budget of the adapters one request stacks (archetype tasks + NPC delta), design
002: past it, memory and swap time grow and quality stops improving."""

MAX_HISTORY = 32
"""Earlier versions kept per archetype and task; older ones are forgotten."""

_SLUG = r"^[a-z0-9][a-z0-9_-]{0,63}$"

Slug = Annotated[str, StringConstraints(strip_whitespace=True, pattern=_SLUG)]
ServerName = Annotated[
    str, StringConstraints(strip_whitespace=True, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
]
MetricName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@/-]{0,63}$")]
Sha256 = Annotated[
    str, StringConstraints(strip_whitespace=True, to_lower=True, pattern=r"^[0-9a-fA-F]{64}$")
]


def _now() -> datetime:
    return datetime.now(UTC)


class AdapterTask(StrEnum):
    """What an adapter specialises the shared base model for (design 002).

    Mythic trains (`mythic train`) and serves two of them: `dialogue_style` (every reply) and
    `action_policy` (intents and decisions). The other five can be registered and are kept and
    versioned, for chains trained elsewhere, but no request applies them yet (`served`).
    """

    PERSONALITY = "personality"
    DIALOGUE_STYLE = "dialogue_style"
    ACTION_POLICY = "action_policy"
    EMOTIONAL_RESPONSE = "emotional_response"
    WORLD_KNOWLEDGE = "world_knowledge"
    SOCIAL_DYNAMICS = "social_dynamics"
    GOAL_PRIORITIZATION = "goal_prioritization"

    @property
    def served(self) -> bool:
        """Whether a request applies this task's adapter; the others' are only kept."""
        return self in SERVED_TASKS


SERVED_TASKS = frozenset({AdapterTask.DIALOGUE_STYLE, AdapterTask.ACTION_POLICY})
"""The tasks whose adapters Mythic trains and applies to requests."""


# -- errors ---------------------------------------------------------------------------------------


class RegistryError(MythicError):
    """Base class of the archetype registry's errors."""


class UnknownArchetypeError(RegistryError):
    """No chain is registered under this archetype name."""

    def __init__(self, archetype: str, known: Sequence[str]) -> None:
        names = ", ".join(sorted(known)) or "none"
        super().__init__(
            f"no archetype chain {archetype!r} (registered: {names})",
            fix=f"mythic archetypes register {archetype} [--voice ...] [--task T --path P]",
        )
        self.archetype = archetype


class InvalidAdapterError(RegistryError):
    """An adapter's record or files are not usable: unreadable, not a LoRA, an unknown task,
    or trained on another base model than the adapters it is stacked with."""


class RankBudgetError(RegistryError):
    """The adapters a request would stack together exceed the chain's rank budget."""

    def __init__(self, archetype: str, adapters: Sequence[AdapterInfo], limit: int) -> None:
        self.total = sum(a.rank for a in adapters)
        self.limit = limit
        parts = " + ".join(f"{a.task} {a.rank}" for a in adapters)
        super().__init__(
            f"{archetype}: stacking {parts} is rank {self.total}, over the budget of {limit}",
            fix="stack fewer adapters, train them at a lower rank, or raise the chain's "
            "max_total_rank",
        )


@dataclass(frozen=True, slots=True)
class RegistryProblem:
    """One thing wrong in a registry's stored data."""

    source: str
    """The file, or the Redis key."""
    line: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        what = f"{self.field}: " if self.field else ""
        return f"{where}: {what}{self.message}"


class RegistryFormatError(RegistryError):
    """A registry file or record is malformed. It is neither used nor overwritten: every read
    and write raises this until it is fixed."""

    def __init__(self, problems: Sequence[RegistryProblem]) -> None:
        lines = "\n".join(f"  {p}" for p in problems)
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"archetype registry unusable, {len(problems)} {noun}:\n{lines}")
        self.problems = list(problems)


class RegistryUnavailableError(RegistryError):
    """The registry could not be read or written (Redis down, a full disk, a lock held too
    long). Nothing was changed; the same call may succeed later."""

    retryable = True


# -- models ---------------------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TrainingData(_Model):
    """What an adapter was trained on."""

    description: Annotated[
        str, StringConstraints(strip_whitespace=True, min_length=1, max_length=2000)
    ]
    """In words: sources, curation, generator (e.g. "ravenmoor lore + persona cards, 1.2k
    bronze dialogues")."""
    examples: int | None = Field(default=None, ge=0)
    """How many training examples."""
    sha256: Sha256 | None = None
    """The data set's hash, to tell retrainings on other data apart."""


class AdapterInfo(_Model):
    """One LoRA adapter of an archetype chain: where it is, what it is, how well it did."""

    task: AdapterTask
    path: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=4096)]
    """A GGUF file or a PEFT folder; a relative path is relative to the registry file's folder
    (`AdapterInfo.resolve`)."""
    format: Literal["gguf", "peft"]
    """`gguf` (llama.cpp) or `peft` (transformers, vLLM)."""
    base_model: Annotated[
        str, StringConstraints(strip_whitespace=True, min_length=1, max_length=500)
    ]
    """The base model it was trained on (a packaged model name or the base's file name)."""
    rank: int = Field(ge=1, le=1024)
    """LoRA rank (the largest, where modules differ)."""
    alpha: float = Field(gt=0)
    """LoRA alpha; left out: the rank (a scale of 1)."""
    target_modules: tuple[str, ...] = ()
    """The modules it adapts (`q_proj`, `attn_q`, ...)."""
    size_bytes: int = Field(default=0, ge=0)
    """Size of the weights on disk."""
    version: int = Field(default=1, ge=1)
    """Numbered by the registry: 1, then one more at each registration for the same task."""
    trained_on: TrainingData | None = None
    metrics: dict[MetricName, float] = Field(default_factory=dict)
    """Evaluation results (loss, style and action scores, ...)."""
    created_at: AwareDatetime = Field(default_factory=_now)

    @model_validator(mode="before")
    @classmethod
    def _alpha_defaults_to_rank(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("alpha") is None:
            rank = data.get("rank")
            # An invalid rank is reported as such, not also as a missing alpha.
            valid = isinstance(rank, int) and not isinstance(rank, bool) and rank > 0
            return {**data, "alpha": rank if valid else 1.0}
        return data

    def resolve(self, root: Path) -> Path:
        """The adapter's path, a relative one taken from `root` (the registry's folder)."""
        path = Path(self.path).expanduser()
        return path if path.is_absolute() else root / path


_TASKS = frozenset(t.value for t in AdapterTask)


def _task(task: AdapterTask | str) -> AdapterTask:
    try:
        return AdapterTask(task)
    except ValueError:
        tasks = ", ".join(t.value for t in AdapterTask)
        raise InvalidAdapterError(f"unknown adapter task {task!r} (tasks: {tasks})") from None


class ArchetypeChain(_Model):
    """Everything that makes an archetype: the adapter of each task and the servers hosting it.
    A served task without an adapter is served by the base model. `voice`, `face` and `body`
    are reserved: kept and listed, not used yet."""

    archetype: Slug
    """Lowercase name: human, vampire, werewolf, zombie, ghoul, lich, or a world's own."""
    voice: Slug | None = None
    """Reserved, not used yet: a voice profile id (`mythic voice list`). An NPC speaks with its
    card's `voice_id`, else the profile named like its archetype, whatever this says."""
    face: Slug | None = None
    """Reserved, not used yet: a face (viseme and expression) profile id."""
    body: Slug | None = None
    """Reserved, not used yet: a body generator id."""
    servers: tuple[ServerName, ...] = ()
    """The servers that host this chain (`embedded`: the in-process engine)."""
    max_total_rank: int = Field(default=DEFAULT_MAX_TOTAL_RANK, ge=1, le=1024)
    """The rank budget of one request's stacked adapters, NPC delta included."""
    updated_at: AwareDatetime = Field(default_factory=_now)
    """When the registry last changed this chain."""
    adapters: dict[AdapterTask, AdapterInfo] = Field(default_factory=dict)
    """The current adapter of each task that has one."""

    @field_validator("servers")
    @classmethod
    def _servers_unique(cls, servers: tuple[str, ...]) -> tuple[str, ...]:
        twice = sorted({s for s in servers if servers.count(s) > 1})
        if twice:
            raise ValueError(f"servers listed twice: {', '.join(twice)}")
        return servers

    @field_validator("adapters")
    @classmethod
    def _adapters_match_tasks(
        cls, adapters: dict[AdapterTask, AdapterInfo]
    ) -> dict[AdapterTask, AdapterInfo]:
        for task, info in adapters.items():
            if info.task != task:
                raise ValueError(f"the adapter under {task.value} is for task {info.task.value}")
        return adapters

    @model_validator(mode="after")
    def _each_adapter_fits_the_budget(self) -> Self:
        for task, info in self.adapters.items():
            if info.rank > self.max_total_rank:
                raise ValueError(
                    f"adapters.{task.value}: rank {info.rank} exceeds max_total_rank "
                    f"{self.max_total_rank}"
                )
        return self

    def adapter(self, task: AdapterTask | str) -> AdapterInfo | None:
        """The current adapter of `task`, or None: the base model serves it."""
        return self.adapters.get(_task(task))

    @property
    def missing(self) -> tuple[AdapterTask, ...]:
        """The tasks without an adapter."""
        return tuple(t for t in AdapterTask if t not in self.adapters)

    def stack(
        self, tasks: Iterable[AdapterTask | str], npc_delta: AdapterInfo | None = None
    ) -> list[AdapterInfo]:
        """The adapters one request applies together: this chain's adapter of each task in
        `tasks` that has one, in that order, then the NPC's own delta.

        Raises:
            RankBudgetError: their ranks add up to more than `max_total_rank`.
            InvalidAdapterError: an unknown task, or adapters of different base models.
        """
        chosen = [
            info for t in dict.fromkeys(_task(t) for t in tasks) if (info := self.adapters.get(t))
        ]
        if npc_delta is not None:
            chosen.append(npc_delta)
        bases = sorted({a.base_model for a in chosen})
        if len(bases) > 1:
            raise InvalidAdapterError(
                f"{self.archetype}: cannot stack adapters trained on different base models "
                f"({', '.join(bases)})",
                fix="retrain or re-register the odd ones out on the same base model",
            )
        if sum(a.rank for a in chosen) > self.max_total_rank:
            raise RankBudgetError(self.archetype, chosen, self.max_total_rank)
        return chosen

    def changed(self, **fields: Any) -> ArchetypeChain:
        """A copy with `fields` replaced, validated (`model_copy` does not validate).

        Raises:
            pydantic.ValidationError: a replaced value is invalid.
        """
        return ArchetypeChain.model_validate({**self.model_dump(), **fields})


History = Mapping[AdapterTask, tuple[AdapterInfo, ...]]
"""Per task, the adapter versions a chain had before its current ones, oldest first."""


@dataclass(frozen=True, slots=True)
class _Entry:
    chain: ArchetypeChain
    history: History = field(default_factory=dict)


def _name(archetype: str) -> str:
    if not isinstance(archetype, str) or not re.fullmatch(_SLUG, archetype):
        raise RegistryError(
            f"{archetype!r} is not an archetype name: lowercase letters, digits, '-' and '_', "
            "starting with a letter or digit, at most 64"
        )
    return archetype


def _retire(old: _Entry | None, chain: ArchetypeChain) -> _Entry:
    """`chain` replacing `old`: each adapter it replaces or drops joins its task's history."""
    history = {t: tuple(v) for t, v in (old.history if old else {}).items()}
    if old is not None:
        for task, info in old.chain.adapters.items():
            if chain.adapters.get(task) != info:
                history[task] = (*history.get(task, ()), info)[-MAX_HISTORY:]
    return _Entry(chain.model_copy(update={"updated_at": _now()}), history)
