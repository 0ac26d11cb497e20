"""The player's microphone audio brought to the 16 kHz the speech models hear."""

from __future__ import annotations


class Decimator:
    """Integer-factor downsampling of PCM16 to 16 kHz with a windowed-sinc low-pass (63 taps,
    cut at 7.2 kHz), keeping state across chunks so chunk edges leave no clicks."""

    def __init__(self, rate: int, target: int = 16000) -> None:
        import numpy as np

        if rate % target:
            raise ValueError(f"{rate} Hz is not a multiple of {target} Hz")
        self.factor = rate // target
        taps = 63
        n = np.arange(taps) - (taps - 1) / 2
        cutoff = 0.45 / self.factor  # of the input rate
        kernel = 2 * cutoff * np.sinc(2 * cutoff * n) * np.hamming(taps)
        self._kernel = (kernel / kernel.sum()).astype(np.float32)
        self._history = np.zeros(taps - 1, dtype=np.float32)
        self._phase = 0

    def __call__(self, pcm: bytes) -> bytes:
        import numpy as np

        if self.factor == 1:
            return pcm
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
        padded = np.concatenate((self._history, samples))
        filtered = np.convolve(padded, self._kernel, mode="valid")
        self._history = padded[-(len(self._kernel) - 1) :]
        picked = filtered[self._phase :: self.factor]
        self._phase = (self._phase - len(filtered)) % self.factor
        return np.clip(np.rint(picked), -32768, 32767).astype("<i2").tobytes()
