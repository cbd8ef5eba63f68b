"""Canonical JSON and SHA-256: the one place every hash in evalrun comes from.

Canonical JSON is RFC 8785 (JCS); every hash is SHA-256 in lowercase hex.

The encoder here produces the same bytes as the reference ``rfc8785`` package (the tests compare
them on generated values) at several times its speed: it is on the hot path of every chained
log line. Strings go through the C string escaper of the standard ``json`` module, whose
escapes are exactly JCS's (the two-character escapes, other control characters as lowercase
``\\u00xx``, everything else literal).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20
MAX_SAFE_INTEGER = 2**53 - 1


class Canonical(str):
    """Text that is already canonical JSON; embedded as is (encode a value once, hash and embed it)."""


class CanonicalJSONError(ValueError):
    """A value JCS cannot represent: NaN, infinity, an integer beyond 2**53 - 1, a non-string key."""


def _es6_number(x: float) -> str:
    """ECMAScript Number::toString for a finite double (RFC 8785 section 3.2.2.3)."""
    if x == 0:
        return "0"
    if not math.isfinite(x):
        raise CanonicalJSONError(f"{x} is not representable in canonical JSON")
    text = repr(x)
    if "e" not in text and not text.endswith(".0"):
        return text  # Python's fixed notation range lies inside ECMAScript's; digits agree
    sign = "-" if x < 0 else ""
    mantissa, _, exp = text.lstrip("-").partition("e")
    whole, _, frac = mantissa.partition(".")
    raw = whole + frac
    digits = raw.lstrip("0")
    point = len(whole) + int(exp or 0) - (len(raw) - len(digits))  # value = 0.DIGITS x 10**point
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= point <= 21:
        body = digits + "0" * (point - k)
    elif 0 < point <= 21:
        body = digits[:point] + "." + digits[point:]
    elif -6 < point <= 0:
        body = "0." + "0" * -point + digits
    else:
        e = point - 1
        body = (digits if k == 1 else digits[0] + "." + digits[1:]) + ("e+" if e > 0 else "e-") + str(abs(e))
    return sign + body


def _utf16_key(key: str) -> bytes:
    return key.encode("utf-16-be")


def _encode(value: Any, out: list[str]) -> None:
    kind = type(value)
    if kind is str:
        out.append(encode_basestring(value))
    elif kind is dict:
        _encode_object(value, out)
    elif kind is list or kind is tuple:
        _encode_array(value, out)
    elif kind is float:
        out.append(_es6_number(value))
    elif kind is bool:
        out.append("true" if value else "false")
    elif kind is int:
        out.append(_int(value))
    elif value is None:
        out.append("null")
    elif kind is Canonical:
        out.append(value)
    elif isinstance(value, str | int | float | dict | list | tuple):
        _encode(_plain(value), out)
    else:
        raise CanonicalJSONError(f"cannot encode {kind.__name__} as canonical JSON")


def _int(value: int) -> str:
    if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        return str(value)
    raise CanonicalJSONError(f"{value} exceeds the safe integer range of JSON numbers")


def _encode_object(value: dict[Any, Any], out: list[str]) -> None:
    if not value:
        out.append("{}")
        return
    keys = list(value)
    try:
        ascii_keys = "".join(keys).isascii()
    except TypeError:
        raise CanonicalJSONError(f"object keys must be strings, got {keys!r}") from None
    if ascii_keys:
        keys.sort()  # code-point order equals UTF-16 order for ASCII
    else:
        keys.sort(key=_utf16_key)
    sep = "{"
    for key in keys:
        item = value[key]
        kind = type(item)
        # Leaves inline: most values of a log entry are strings and small integers.
        if kind is str:
            out.append(f"{sep}{encode_basestring(key)}:{encode_basestring(item)}")
        elif kind is int:
            out.append(f"{sep}{encode_basestring(key)}:{_int(item)}")
        else:
            out.append(f"{sep}{encode_basestring(key)}:")
            _encode(item, out)
        sep = ","
    out.append("}")


def _encode_array(value: list[Any] | tuple[Any, ...], out: list[str]) -> None:
    if not value:
        out.append("[]")
        return
    first = type(value[0])
    if first is int and all(type(v) is int for v in value):  # token ids
        if not -MAX_SAFE_INTEGER <= min(value) <= max(value) <= MAX_SAFE_INTEGER:
            raise CanonicalJSONError("an integer exceeds the safe integer range of JSON numbers")
        out.append("[" + ",".join(map(str, value)) + "]")
        return
    if first is float and all(type(v) is float for v in value):  # logprobs
        out.append("[" + ",".join(map(_es6_number, value)) + "]")
        return
    sep = "["
    for element in value:
        out.append(sep)
        _encode(element, out)
        sep = ","
    out.append("]")


def _plain(value: Any) -> Any:
    """Subclasses (IntEnum, OrderedDict, ...) as their base type."""
    for base in (bool, str, int, float):
        if isinstance(value, base):
            return base(value)
    return dict(value) if isinstance(value, dict) else list(value)


def canonical_json(value: Any) -> str:
    """RFC 8785 serialisation of ``value`` as text (no trailing newline)."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out)


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def canonical_hash(value: Any) -> str:
    """SHA-256 of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def combine(parts: Iterable[str]) -> str:
    """Digest of several hex hashes: sha256 of their concatenation, in the order given."""
    return sha256_hex("".join(parts))
