"""Semantic end of turn: whether the player has finished speaking, from the sound of it.

Smart Turn v3.2 (Daily, BSD-2-Clause) is a Whisper-tiny encoder with a small classifier,
8 MB in int8 ONNX: given the last 8 s of an utterance (16 kHz), it says how likely the turn
is complete, from the words and from the prosody (a falling pitch, a drawn-out "and...").
Pipecat's wheel (`pipecat-ai`) ships its CPU model as package data; the model is found in
that wheel without importing Pipecat (whose import needs its many dependencies: `make setup`
installs the wheel with `--no-deps`, as the model packages are). It runs in the ASR worker
processes, beside Whisper, with onnxruntime.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from mythic._extras import require
from mythic.speech._errors import SpeechModelError

__all__ = ["SMART_TURN_PACKAGE", "TurnModel", "smart_turn_path"]

SMART_TURN_PACKAGE = "pipecat-ai==1.14.0"
"""The wheel that ships the model (pinned in constraints.txt; installed with --no-deps)."""

_MODEL = Path("audio", "turn", "smart_turn", "data", "smart-turn-v3.2-cpu.onnx")
_SAMPLE_RATE = 16000
_WINDOW_S = 8  # the model hears the last 8 s; a shorter utterance is padded before it
_VARIANCE_EPS = 1e-7


def smart_turn_path() -> Path:
    """Smart Turn v3.2's CPU model inside the installed `pipecat-ai` wheel.

    Raises:
        SpeechModelError: the wheel is not installed, or ships no such model.
    """
    spec = importlib.util.find_spec("pipecat")
    fix = (
        f"pip install --no-deps '{SMART_TURN_PACKAGE}' (make setup does), or set "
        "speech.turn_detector: silence"
    )
    if spec is None or not spec.submodule_search_locations:
        raise SpeechModelError(
            "the Smart Turn model's package (pipecat-ai) is not installed", fix=fix
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _MODEL
    if not path.is_file():
        raise SpeechModelError(f"no Smart Turn model at {path}", fix=fix)
    return path


class TurnModel:
    """Smart Turn on onnxruntime: `complete(audio)` is the probability that the turn ended.

    Takes float32 audio at 16 kHz (the utterance so far, silence after the speech included);
    about 20-60 ms a call on one CPU core. Its features are Whisper's 80-bin log-mel
    spectrogram of the last 8 s, the audio normalised to zero mean and unit variance first,
    and zeros before a shorter utterance (as Smart Turn was trained).
    """

    def __init__(self, path: Path | None = None, *, threads: int = 1) -> None:
        np_ = require("numpy", package="numpy", extra="speech")
        ort = require("onnxruntime", package="onnxruntime", extra="speech")
        require("faster_whisper", package="faster-whisper", extra="speech")
        features: Any = importlib.import_module("faster_whisper.feature_extractor")
        self.path = path or smart_turn_path()
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, threads)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 4
        try:
            self._session = ort.InferenceSession(
                str(self.path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise SpeechModelError(f"cannot load the turn model {self.path}: {exc}") from exc
        self._input = self._session.get_inputs()[0].name
        self._np: Any = np_
        self._mel = features.FeatureExtractor(
            feature_size=80, sampling_rate=_SAMPLE_RATE, chunk_length=_WINDOW_S
        )
        self.complete(np_.zeros(_SAMPLE_RATE, dtype=np_.float32))  # buffers allocated now

    def features(self, audio: Any) -> Any:
        """(80, 800) log-mel features of the last 8 s of `audio`."""
        np = self._np
        samples = _SAMPLE_RATE * _WINDOW_S
        x = np.asarray(audio, dtype=np.float32)[-samples:]
        if x.size < samples:
            x = np.pad(x, (samples - x.size, 0))
        x = (x - x.mean()) / np.sqrt(x.var() + _VARIANCE_EPS)
        mel = self._mel(x, padding=0)  # 800 frames: its last (centred) frame is dropped
        return np.ascontiguousarray(mel, dtype=np.float32)

    def complete(self, audio: Any) -> float:
        """The probability (0-1) that the speaker has finished their turn."""
        out = self._session.run(None, {self._input: self.features(audio)[None]})
        return float(self._np.asarray(out[0]).reshape(-1)[0])
