"""Phonemes to visemes: the mouth shapes an NPC's face shows while it speaks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import NamedTuple

__all__ = ["PHONEME_VISEMES", "VISEMES", "Viseme", "viseme_for", "viseme_track"]

VISEMES: tuple[str, ...] = (
    "sil",
    "PP",
    "FF",
    "TH",
    "DD",
    "kk",
    "CH",
    "SS",
    "nn",
    "RR",
    "aa",
    "E",
    "ih",
    "oh",
    "ou",
)
"""The 15 visemes of the Oculus/Meta lip-sync set, in its order (index = viseme number).

    sil  silence, mouth at rest         PP  p b m (lips closed)       FF  f v (lip on teeth)
    TH   th (tongue between teeth)      DD  t d (tongue on ridge)     kk  k g ng h (back)
    CH   ch j sh zh (lips pushed out)   SS  s z (teeth together)      nn  n l
    RR   r, r-coloured vowels           aa  a (jaw open)              E   e, schwa
    ih   i, y glide                     oh  o (rounded, open)         ou  u oo, w glide

Game engines with ARKit blend shapes or Preston Blair mouth charts map these 15 names
onto their own rig once; every chunk of speech carries them with times.
"""


def _table(groups: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(
        {symbol: viseme for viseme, symbols in groups.items() for symbol in symbols}
    )


PHONEME_VISEMES: Mapping[str, str] = _table(
    {
        # Piper's sentence start/end and pad symbols, punctuation (a pause) and the glottal stop.
        "sil": '^$_.,!?;:\u2026\u2014\u2013"\u0294',
        "PP": "pbm",
        "FF": "fv",
        "TH": "\u03b8\u00f0",  # theta, eth
        "DD": "td\u027e",  # t d, the flap
        # The back consonants; h takes this shape too, as in Amazon Polly's viseme set.
        "kk": "kg\u0261\u014bx\u0263h\u0266",  # k g (both g glyphs), eng, x, gamma, h, voiced h
        "CH": "\u0283\u0292\u00e7",  # esh, ezh, c-cedilla; espeak writes ch/j as t+esh, d+ezh
        "SS": "sz",
        "nn": "nl\u026b\u0272",  # n l, dark l, palatal n
        "RR": "r\u0279\u027b\u0281\u025a\u025d",  # the r sounds, r-coloured schwas
        "aa": "a\u0251\u00e6\u028c\u0250",  # a, alpha, ash, wedge, turned a
        "E": "e\u025b\u0259\u025c\u00f8\u0153",  # e, epsilon, schwa, rev. epsilon, o-slash, oe
        "ih": "i\u026aj\u1d7b\u0268y",  # i, small-cap i, j, barred i, y
        "oh": "o\u0254\u0252\u0275\u0264",  # o, open o, turned alpha, barred o, ram horns
        "ou": "u\u028aw\u0289\u026f\u028d",  # u, upsilon, w, barred u, turned m, turned w
    }
)
"""IPA symbols (as espeak-ng and Piper write them, one code point each) to visemes.

A symbol not in the table (stress and length marks, the space between words, a symbol of
another language) holds the previous shape: its time is added to the viseme before it.
"""


class Viseme(NamedTuple):
    """A mouth shape from a time on: `t` seconds from the start of its chunk."""

    t: float
    label: str


def viseme_for(phoneme: str) -> str | None:
    """The viseme of one IPA symbol, or None when the symbol holds the previous shape."""
    return PHONEME_VISEMES.get(phoneme)


def viseme_track(phonemes: Iterable[tuple[str, float]], *, start_s: float = 0.0) -> list[Viseme]:
    """Timed phonemes to the change points of the mouth shape.

    Args:
        phonemes: (IPA symbol, duration in seconds) in spoken order.
        start_s: time of the first phoneme.

    Returns:
        Visemes with strictly increasing times, starting at `start_s` (with `sil` when the
        first symbols hold a shape), no label repeated back to back.
    """
    track: list[Viseme] = [Viseme(start_s, "sil")]
    t = start_s
    for phoneme, seconds in phonemes:
        label = viseme_for(phoneme)
        if label is not None and label != track[-1].label:
            if t <= track[-1].t:
                track[-1] = Viseme(track[-1].t, label)
                if len(track) > 1 and track[-2].label == label:
                    track.pop()
            else:
                track.append(Viseme(t, label))
        t += max(0.0, seconds)
    return track


def slice_track(track: list[Viseme], start_s: float, end_s: float) -> tuple[Viseme, ...]:
    """The part of a track inside [start_s, end_s), times relative to `start_s`.

    The shape already showing at `start_s` comes first at t=0, so every chunk stands alone.
    """
    current = "sil"
    inside: list[Viseme] = []
    length = end_s - start_s
    for mark in track:
        t = round(mark.t - start_s, 4)
        if mark.t >= end_s or t >= length:
            break  # rounded onto the chunk's end: it is the next chunk's first shape
        if t <= 0.0:
            current = mark.label
        elif inside and t <= inside[-1].t:
            inside[-1] = Viseme(inside[-1].t, mark.label)
        else:
            inside.append(Viseme(t, mark.label))
    marks = [Viseme(0.0, current)]
    for mark in inside:
        if mark.label != marks[-1].label:
            marks.append(mark)
    return tuple(marks)
