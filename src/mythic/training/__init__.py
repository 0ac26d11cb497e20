"""Archetype adapters: curate data from a world, train a LoRA, export it, evaluate it.

`curate` builds an archetype's examples for one task from the world's persona cards and
lore (plus extra JSON lines, such as bronze-generated dialogues); `train_adapter` trains a
PEFT LoRA on CPU over the base GGUF (the `train` extra: torch, transformers, peft);
`export_gguf` writes it as a GGUF LoRA for llama.cpp; `evaluate_archetype` scores it against
the base model in the same run. Importing this package loads none of torch or transformers.
"""

from mythic.training._curate import (
    EVAL_QUESTIONS,
    GREETINGS,
    TASKS,
    CurationError,
    Dataset,
    Example,
    ExtraDialogue,
    curate,
    load_extra,
)
from mythic.training._evaluate import (
    ArchetypeEval,
    Gate,
    LoreQuestion,
    ProbeResult,
    evaluate_archetype,
    style_score,
)
from mythic.training._export import ExportError, export_gguf
from mythic.training._styles import SCENARIOS, STYLES, ArchetypeStyle, Scenario
from mythic.training._train import (
    TARGETS,
    BuiltAdapter,
    TrainingError,
    TrainResult,
    TrainSettings,
    build_adapter,
    load_base,
    next_version,
    train_adapter,
)

__all__ = [
    "EVAL_QUESTIONS",
    "GREETINGS",
    "SCENARIOS",
    "STYLES",
    "TARGETS",
    "TASKS",
    "ArchetypeEval",
    "ArchetypeStyle",
    "BuiltAdapter",
    "CurationError",
    "Dataset",
    "Example",
    "ExportError",
    "ExtraDialogue",
    "Gate",
    "LoreQuestion",
    "ProbeResult",
    "Scenario",
    "TrainResult",
    "TrainSettings",
    "TrainingError",
    "build_adapter",
    "curate",
    "evaluate_archetype",
    "export_gguf",
    "load_base",
    "load_extra",
    "next_version",
    "style_score",
    "train_adapter",
]
