"""The world guard: a world makes no network call and reads nothing that varies except through its effects, and any
attempt fails its episode loudly.

While a guard is active, creating a socket, connecting one (also one made before), or resolving a name raises
:class:`NetworkUsed`; reading the machine's clock (``time.time``, ``time.monotonic``, ``time.perf_counter`` and
their ``_ns`` forms), the ``random`` module's functions (its hidden shared generator) or ``random.SystemRandom``
(so ``secrets``), ``uuid.uuid1``/``uuid.uuid4``, ``os.urandom`` and the process environment (``os.environ``,
``os.getenv``) raises :class:`RecorderBypassed`, naming the call and the effect to read instead: such a read is the
first way a replay goes wrong, since the recorder never saw it. The patches are installed when the first guard
opens and removed when the last one closes (a counter under a lock).

By default a guard covers only the thread that opened it, so the harness can guard each episode's world calls
while other threads of the worker (the engine, Ray, logging) keep their sockets, clocks and environment.
``all_threads=True`` covers every thread of the process, for a world run that spawns threads. A guard wraps world
code (reset, tool calls and the verifier), never the engine.

What it cannot see: a function bound before the guard was installed (``from time import time`` at a module's
import), C code reading the clock itself (``datetime.now()``, ``datetime.today()``) and a ``random.Random()`` made
without a seed (seeded from the OS in C): worlds take dates from ``effects.clock()`` and generators from
``derive_rng``, and a review of a world checks for these.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class NetworkUsed(RuntimeError):
    """A socket was used inside a world guard (during an episode's world code)."""


class RecorderBypassed(RuntimeError):
    """World code read the clock, randomness, a fresh id or the environment other than through its effects."""


_lock = threading.Lock()
_local = threading.local()
_open_guards = 0  # every active guard, of any scope: the patch is installed while > 0
_process_guards = 0  # active all-threads guards
_originals: dict[str, Any] = {}


def _guarded() -> bool:
    return _process_guards > 0 or getattr(_local, "depth", 0) > 0


def _blocking(what: str, original: Callable[..., Any], describe: Callable[..., str]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _guarded():
            raise NetworkUsed(f"network use during an episode: {what}({describe(*args, **kwargs)})")
        return original(*args, **kwargs)

    wrapper.__name__ = getattr(original, "__name__", what)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    return wrapper


def _bypass(what: str, original: Callable[..., Any], instead: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _guarded():
            raise RecorderBypassed(f"{what} read during an episode's world code, bypassing the recorder: read it "
                                   f"through the world's effects ({instead})")  # fmt: skip
        return original(*args, **kwargs)

    wrapper.__name__ = getattr(original, "__name__", what)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    return wrapper


CLOCK = ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns")
# the random module's functions that draw from its hidden shared generator (random._inst)
_SHARED = getattr(random, "_inst", None)
RANDOM = tuple(sorted(name for name in dir(random) if getattr(getattr(random, name), "__self__", 0) is _SHARED))
SYSTEM_RANDOM = ("random", "getrandbits", "randbytes")  # random.SystemRandom's, which secrets draws from
ENVIRON = ("__getitem__", "__iter__")  # os._Environ's: get, getenv, "in", copy and listing all go through them
# (module or class, attribute, name in the message, the effect to read instead)
_BYPASSES: tuple[tuple[Any, str, str, str], ...] = (
    *((time, name, f"time.{name}()", "effects.clock()") for name in CLOCK),
    *((random, name, f"random.{name}()", "effects.random(purpose, bits)") for name in RANDOM),
    *((random.SystemRandom, name, f"random.SystemRandom.{name}()", "effects.random(purpose, bits)")
      for name in SYSTEM_RANDOM),
    (uuid, "uuid1", "uuid.uuid1()", "effects.uuid()"),
    (uuid, "uuid4", "uuid.uuid4()", "effects.uuid()"),
    (os, "urandom", "os.urandom()", "effects.random(purpose, bits)"),
    *((type(os.environ), name, "os.environ", "effects.env(name)") for name in ENVIRON),
)  # fmt: skip
_replaced: list[tuple[Any, str, Any]] = []  # (owner, attribute, original) of the installed bypass patches


def _address(_sock: Any = None, address: Any = None, *_: Any, **__: Any) -> str:
    return repr(address)


def _first(first: Any = None, *_: Any, **__: Any) -> str:
    return repr(first)


def _socket_args(_sock: Any = None, family: Any = -1, kind: Any = -1, *_: Any, **kwargs: Any) -> str:
    return f"family={kwargs.get('family', family)!r}, type={kwargs.get('type', kind)!r}"


def _install() -> None:
    cls = socket.socket
    _originals.update(
        init=cls.__dict__["__init__"],
        connect=cls.__dict__.get("connect"),
        connect_ex=cls.__dict__.get("connect_ex"),
        create_connection=socket.create_connection,
        getaddrinfo=socket.getaddrinfo,
    )
    cls.__init__ = _blocking("socket.socket", _originals["init"], _socket_args)  # type: ignore[method-assign]
    cls.connect = _blocking("socket.connect", cls.connect, _address)  # type: ignore[method-assign]
    cls.connect_ex = _blocking("socket.connect_ex", cls.connect_ex, _address)  # type: ignore[method-assign]
    socket.create_connection = _blocking("socket.create_connection", _originals["create_connection"], _first)
    socket.getaddrinfo = _blocking("socket.getaddrinfo", _originals["getaddrinfo"], _first)
    for owner, name, what, instead in _BYPASSES:
        original = getattr(owner, name)
        _replaced.append((owner, name, original))
        setattr(owner, name, _bypass(what, original, instead))


def _uninstall() -> None:
    cls = socket.socket
    cls.__init__ = _originals["init"]  # type: ignore[method-assign]
    for name in ("connect", "connect_ex"):
        if _originals[name] is None:  # inherited from the C socket type: drop the override
            delattr(cls, name)
        else:
            setattr(cls, name, _originals[name])
    socket.create_connection = _originals["create_connection"]
    socket.getaddrinfo = _originals["getaddrinfo"]
    _originals.clear()
    while _replaced:
        owner, name, original = _replaced.pop()
        setattr(owner, name, original)


@contextmanager
def world_guard(*, all_threads: bool = False) -> Iterator[None]:
    """Within the block, socket use raises :class:`NetworkUsed`, and a read of the clock, randomness, a fresh id or
    the environment other than through effects :class:`RecorderBypassed` (in this thread, or in every thread)."""
    global _open_guards, _process_guards
    with _lock:
        if _open_guards == 0:
            _install()
        _open_guards += 1
        if all_threads:
            _process_guards += 1
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1
        with _lock:
            if all_threads:
                _process_guards -= 1
            _open_guards -= 1
            if _open_guards == 0:
                _uninstall()
