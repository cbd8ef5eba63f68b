"""The built-in normalisers (``task.scorer.normalize``).

``strip`` and ``lower`` are ``str``'s own methods, registered as they are: a normaliser runs twice
per scored row, and a method in C is several times faster than a function that calls it.
"""

from __future__ import annotations

import string

from evalrun.scoring.registry import normalizer

_PUNCTUATION = str.maketrans("", "", string.punctuation)

normalizer("strip")(str.strip)
normalizer("lower")(str.lower)


@normalizer("collapse_whitespace")
def collapse_whitespace(text: str) -> str:
    return " ".join(text.split())


@normalizer("strip_punctuation")
def strip_punctuation(text: str) -> str:
    return text.translate(_PUNCTUATION)
