"""The network guard: a world makes no network call, and any attempt fails its episode loudly.

While a guard is active, creating a socket, connecting one (also one made before), or resolving a
name raises :class:`NetworkUsed` naming what was attempted. The patch of the ``socket`` module is
installed when the first guard opens and removed when the last one closes (a counter under a lock).

By default a guard covers only the thread that opened it, so the harness can guard each episode's
world calls while other threads of the worker (the engine, Ray, logging) keep their sockets.
``all_threads=True`` covers every thread of the process, for a world run that spawns threads.
A guard wraps world code (reset and tool calls), never the engine.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class NetworkUsed(RuntimeError):
    """A socket was used inside a network guard (during an episode's world code)."""


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


@contextmanager
def network_guard(*, all_threads: bool = False) -> Iterator[None]:
    """Within the block, socket use raises :class:`NetworkUsed` (in this thread, or in every thread)."""
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
