"""RUN_DIR/logs/: the engine's and Ray's log lines of the invocation that finished a run (docs/design.md "Logs").

Provenance, like ``timings``: written before record.json, which lists them in ``logs``, and hashed nowhere.
Collecting them never fails a run: a log that could not be fetched or written is named in ``logs.failed``
(and in one warning line on stderr), and the run completes as it would have without it.
"""

from __future__ import annotations

import sys
from typing import Any

from evalrun.errors import WriteFailed, first_line
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.worker import CollectedLogs
from evalrun.rundir import layout, writer


def write_logs(run: layout.RunDir, dispatcher: Dispatcher) -> dict[str, Any]:
    """Fetch the dispatcher's logs and write each to LOGS/<name>.log; returns record.json's ``logs``:
    ``files`` (paths relative to the run directory, in name order) and ``failed`` (log name -> why)."""
    fetch = getattr(dispatcher, "logs", None)
    if fetch is None:  # a dispatcher plug-in that keeps no logs: nothing went wrong, nothing to warn about
        return {"files": [], "failed": {"dispatcher": "it has no logs()"}}
    files: list[str] = []
    failed: dict[str, str] = {}
    try:
        collected = fetch()
    except Exception as exc:  # a log must never fail a run: recorded instead
        collected = CollectedLogs({}, {"dispatcher": first_line(exc)})
    failed.update(collected.failed)
    for name, text in sorted(collected.texts.items()):
        try:
            path = run.log_file(name)
            path.parent.mkdir(exist_ok=True)
            writer.write_atomic(path, text.encode("utf-8", errors="replace"))
        except (ValueError, OSError, WriteFailed) as exc:
            failed[name] = first_line(exc)
            continue
        files.append(path.relative_to(run.path).as_posix())
    for name, why in sorted(failed.items()):
        print(f"evalrun: warning: the log of {name} was not kept ({why}); record.json names it in logs.failed",
              file=sys.stderr)  # fmt: skip
    return {"files": files, "failed": dict(sorted(failed.items()))}
