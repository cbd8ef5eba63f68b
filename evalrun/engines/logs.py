"""Where the engine's, Ray's and their libraries' log lines go (docs/design.md "Logs").

Never to stdout (the results and the run directory are there). Every record reaches this process's
:class:`LogCapture`, which the run writes to ``RUN_DIR/logs/``; stderr gets only WARNING and above, and of the
engine's libraries (vLLM's, Ray's, torch's, transformers') only ERROR and above: their warnings are about the
machine (tcmalloc, thread binding, Triton), the same on every dispatcher, and a Ray worker's never reach the
terminal either (library deprecation warnings excepted), or everything with ``evalrun -v``. Routing is done with
logging handlers on the root logger, not by redirecting file descriptors, so it holds whichever
thread builds the engine: :func:`route` adds them once, and takes over the stream handlers the
libraries install on their own loggers (vLLM's, Ray's, torch's, transformers'), so their records
reach the root instead. Call it again after importing such a library (it is idempotent and cheap).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import sys
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

LIBRARIES = ("vllm", "ray", "torch", "transformers")  # loggers that install their own stream handlers
LINE_FORMAT = "%(asctime)s %(levelname)s [%(name)s %(filename)s:%(lineno)d] %(message)s"
STDERR_FORMAT = "%(name)s: %(levelname)s: %(message)s"
CAPTURE_LIMIT = 8 * 1024 * 1024  # characters a capture keeps: the first half and the last half
SHOWN_LIMIT = 4096  # distinct warnings remembered, to show each once
DEPRECATION = re.compile(r": (Deprecation|PendingDeprecation|Future)Warning: ")


class LogCapture(logging.Handler):
    """This process's log records, formatted, in memory: the first and last ``limit / 2`` characters
    (a long run's log cannot grow without bound; the gap is marked in :meth:`text`)."""

    def __init__(self, limit: int = CAPTURE_LIMIT) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(LINE_FORMAT))
        self._half = limit // 2
        self._head: list[str] = []
        self._head_size = 0
        self._tail: deque[str] = deque()
        self._tail_size = 0
        self._dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:  # a record that cannot be formatted must not break the caller
            self.handleError(record)
            return
        if self._head_size + len(line) <= self._half and not self._tail:
            self._head.append(line)
            self._head_size += len(line)
            return
        self._tail.append(line)
        self._tail_size += len(line)
        while self._tail_size > self._half and len(self._tail) > 1:
            self._tail_size -= len(self._tail.popleft())
            self._dropped += 1

    def text(self) -> str:
        with self.lock:  # type: ignore[union-attr]
            gap = [f"[... {self._dropped} log lines left out ...]\n"] if self._dropped else []
            return "".join([*self._head, *gap, *self._tail])


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is when a record comes (a caller or a test may replace it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(STDERR_FORMAT))
        self.everything = False
        self.shown: set[tuple[str, str]] = set()
        self.addFilter(self._wanted)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ sets it: always sys.stderr here
        pass

    def _wanted(self, record: logging.LogRecord) -> bool:
        """Everything with ``-v``; else WARNING and above (an engine library's: ERROR and above), each message once,
        and not a library's deprecation warning (addressed to that library's developers: the log file has it)."""
        if self.everything:
            return True
        library = record.name.split(".")[0] in LIBRARIES
        if record.levelno < (logging.ERROR if library else logging.WARNING):
            return False
        message = record.getMessage()
        if record.name == "py.warnings" and DEPRECATION.search(message):
            return False
        key = (record.name, message)
        if key in self.shown:
            return False
        if len(self.shown) >= SHOWN_LIMIT:  # so that a run of distinct warnings cannot grow it without bound
            self.shown.clear()
        self.shown.add(key)
        return True


class _Routing:
    def __init__(self) -> None:
        self.capture = LogCapture()
        self.stderr = StderrHandler()


_lock = threading.Lock()
_routing: _Routing | None = None


def route(verbose: bool | None = None, *, stderr_is_a_log: bool = False) -> LogCapture:
    """Route this process's library logging (idempotent): every record into the returned capture,
    stderr at WARNING and above (``verbose``: everything; None keeps the current choice), stdout never.
    Python warnings go through logging (``py.warnings``) too. ``stderr_is_a_log``: this process's
    stderr is a log file (a Ray actor's): every record goes there, in the log file's line format."""
    global _routing
    with _lock:
        if _routing is None:
            _routing = _Routing()
            root = logging.getLogger()
            root.addHandler(_routing.capture)
            root.addHandler(_routing.stderr)
            logging.captureWarnings(True)
        if stderr_is_a_log:
            _routing.stderr.setFormatter(logging.Formatter(LINE_FORMAT))
            verbose = True
        if verbose is not None:  # a command starts (the CLI's call): each message once per command
            _routing.stderr.everything = verbose
            _routing.stderr.shown.clear()
        _adopt_library_loggers()
        return _routing.capture


def verbose() -> bool:
    """Whether stderr gets every record (``evalrun -v``)."""
    return _routing is not None and _routing.stderr.everything


def _adopt_library_loggers() -> None:
    """The libraries' own stream handlers removed (file handlers kept) and their records sent to the root,
    vLLM's logger at its INFO level (``VLLM_LOGGING_LEVEL``) as vLLM's own configuration would set it."""
    vllm = logging.getLogger("vllm")
    if vllm.level == logging.NOTSET:
        vllm.setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())
    names = [n for n in list(logging.root.manager.loggerDict) if n.split(".")[0] in LIBRARIES]
    for name in names:
        logger = logging.getLogger(name)
        streams = [h for h in logger.handlers if _writes_to_a_stream(h)]
        for handler in streams:
            logger.removeHandler(handler)
        if streams:
            logger.propagate = True


def _writes_to_a_stream(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)


class Watch(logging.Handler):
    """The first number a logger's record matching ``pattern`` (one group) gives, while it is watched
    (:func:`watching`): what a library says of itself that no API returns (vLLM's warm-up seconds)."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        super().__init__()
        self.pattern = pattern
        self.value: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.value is None:
            found = self.pattern.search(record.getMessage())
            if found is not None:
                self.value = float(found.group(1))


@contextlib.contextmanager
def watching(logger: str, pattern: re.Pattern[str]) -> Iterator[Watch]:
    """Watch ``logger``'s records for ``pattern`` while the block runs (the watch's ``value``: None if none came)."""
    watch = Watch(pattern)
    target = logging.getLogger(logger)
    target.addHandler(watch)
    try:
        yield watch
    finally:
        target.removeHandler(watch)


def disable_vllm_logging_config() -> dict[str, Any]:
    """vLLM engine arguments that stop vLLM from installing its own stdout handler (its records then
    reach :func:`route`'s handlers); none when the user gave vLLM a logging config file of their own
    (``VLLM_LOGGING_CONFIG_PATH``), which vLLM applies only with its configuration on."""
    if os.environ.get("VLLM_LOGGING_CONFIG_PATH"):
        return {}
    from vllm.config.logging import LoggingConfig

    return {"logging_config": LoggingConfig(configure_logging=False)}


def stdio_files_text(limit: int = CAPTURE_LIMIT) -> str | None:
    """What this process wrote to its stdout and stderr, when both are regular files (a Ray worker's
    ``worker-*.out`` and ``.err``): log records and C++ and ``print`` output alike, in the order they
    came (the last ``limit`` bytes of each). None when either is not a regular file or cannot be read back
    (Linux's /proc/self/fd reopens them)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    texts, seen = [], set()
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            info = os.fstat(fd)
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode):
            return None
        if (info.st_dev, info.st_ino) in seen:  # both point at one file
            continue
        seen.add((info.st_dev, info.st_ino))
        start = max(0, info.st_size - limit)
        try:  # opened anew for reading (Ray opens them write-only): /proc/self/fd/N names the file itself
            with open(f"/proc/self/fd/{fd}", "rb") as file:
                file.seek(start)
                text = file.read(info.st_size - start).decode("utf-8", errors="replace")
        except OSError:
            return None
        if text:
            cut = f"[... the first {start} bytes left out ...]\n" if start else ""
            texts.append(f"=== {name} ===\n{cut}{text}")
    return "".join(texts)
