"""Terminal progress for long runs: episodes done/total, episodes/s, tokens/s, ETA (on stderr)."""

from __future__ import annotations

import sys
import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class RunProgress:
    def __init__(self, total: int, description: str, enabled: bool = True, done: int = 0) -> None:
        self._enabled = enabled
        self._tokens = 0
        self._started = time.perf_counter()
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("episodes"),
            TextColumn("{task.fields[eps]:.1f} ep/s"),
            TextColumn("{task.fields[tps]:.0f} tok/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(file=sys.stderr),
            disable=not enabled,
        )
        self._done_before = done  # episodes finished by an earlier driver (resume): not in the rates
        self._task = self._progress.add_task(description, total=total, completed=done, eps=0.0, tps=0.0)

    def __enter__(self) -> RunProgress:
        self._started = time.perf_counter()
        self._progress.start()
        return self

    def advance(self, episodes: int, tokens: int) -> None:
        if not self._enabled:  # nothing is shown: rich's update, a lock and a task's samples, is left out
            return
        self._tokens += tokens
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        done = self._progress.tasks[0].completed + episodes - self._done_before
        self._progress.update(self._task, advance=episodes, eps=done / elapsed, tps=self._tokens / elapsed)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()
