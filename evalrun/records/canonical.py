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
from collections.abc import Iterable, Iterator, Mapping
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
    """ECMAScript Number::toString for a finite double (RFC 8785 section 3.2.2.3).

    ``repr`` gives the same shortest round-trip digits as ECMAScript; only the notation differs.
    Python writes ``d.ddde±XX`` below 1e-4 and from 1e16 on, ECMAScript below 1e-6 and from 1e21
    on, so the common case (a small logprob such as -2.4676019165781327e-05) is a rewrite of the
    exponent or a shift of the point.
    """
    text = repr(x)
    if "e" not in text:
        if text[-2:] == ".0":
            return "0" if x == 0 else text[:-2]  # integral, below 1e16 (-0.0 is "0")
        if text[-1] in "fn":  # inf, -inf, nan
            raise CanonicalJSONError(f"{x} is not representable in canonical JSON")
        return text  # Python's fixed notation range lies inside ECMAScript's; digits agree
    if text[-4:-2] == "e-":  # Python's exponent has two digits at least: e-05 ... e-99
        if text[-2] != "0":
            return text  # e-10 ... e-99: the same in ECMAScript
        last = text[-1]
        if last > "6":
            return text[:-2] + last  # e-07 ... e-09: ECMAScript writes e-7 ... e-9
        point = "0.0000" if last == "5" else "0.00000"  # e-05, e-06: ECMAScript writes them in full
        if text[0] == "-":
            return f"-{point}{text[1]}{text[3:-4]}"  # the mantissa's digits without its point
        return f"{point}{text[0]}{text[2:-4]}"
    mantissa, _, exp = text.partition("e")
    e = int(exp)  # value = D.DDD x 10**e, the mantissa without trailing zeros
    if e < -6:
        return f"{mantissa}e{e}"
    if e >= 21:
        return f"{mantissa}e+{e}"
    sign = "-" if mantissa[0] == "-" else ""
    digits = mantissa.lstrip("-").replace(".", "")
    if e < 0:  # -6 <= e <= -5
        return f"{sign}0.{'0' * (-e - 1)}{digits}"
    return sign + digits + "0" * (e + 1 - len(digits))  # 16 <= e <= 20: an integer of e + 1 digits


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


def json_number(text: str) -> int | float:
    """A JSON integer as canonical JSON (RFC 8785) means it: within the safe range an int, beyond it the double it
    denotes (a float written without a fraction, e.g. a summary's perplexity of 7e15, is read back as a float)."""
    value = int(text)
    return value if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER else float(text)


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


SLOT = Canonical("\x00")
"""A place in :func:`canonical_template`'s value (a NUL never appears literally in canonical JSON: strings
escape it)."""


def canonical_template(value: Any, slots: int) -> tuple[str, ...]:
    """The canonical JSON of ``value`` cut at each of its ``slots`` :data:`SLOT` s, in the order the text holds
    them (object keys sorted): joined with the canonical texts of values (:func:`canonical_integer`, a
    string through the encoder), the pieces are the canonical JSON of ``value`` with those values in place.
    For many values alike but in a few places (the plan's episode ids and seeds)."""
    pieces = tuple(canonical_json(value).split(SLOT))
    if len(pieces) != slots + 1:
        raise ValueError(f"expected {slots} slots, the value holds {len(pieces) - 1}")
    return pieces


def canonical_integer(value: int) -> str:
    return _int(value)


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


def differences(expected: Any, found: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(dotted path, expected, found) for every leaf in which two records differ: mappings key by key (the
    expected's keys first), lists of one length item by item (``filter_list.0.regex_pattern``); a mapping against
    a non-mapping, or lists of two lengths, are one difference."""
    if isinstance(expected, Mapping) and isinstance(found, Mapping):
        for key in [*expected, *(k for k in found if k not in expected)]:
            yield from differences(expected.get(key), found.get(key), f"{path}.{key}" if path else str(key))
    elif isinstance(expected, list) and isinstance(found, list) and len(expected) == len(found):
        for i, (a, b) in enumerate(zip(expected, found, strict=True)):
            yield from differences(a, b, f"{path}.{i}" if path else str(i))
    elif expected != found:
        yield path, expected, found
