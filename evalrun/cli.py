"""The ``evalrun`` command.

    evalrun run [-m] [KEY=VALUE ...]     Hydra overrides; -m sweeps (a=1,2) as one multirun

The last line on stdout of ``run`` is the run directory (one line per job with -m). Exit codes:
0 success, 1 a check failed, 2 bad input or usage (the message names the file, field or line).
"""

from __future__ import annotations

import sys

from evalrun.errors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK, BadInput, CheckFailed

USAGE = __doc__ or ""


def _run(args: list[str]) -> int:
    from evalrun.config import compose_config, expand_multirun, validate
    from evalrun.dispatch import Dispatcher, dispatcher_key
    from evalrun.runner import execute, open_for, prepare

    multirun = any(a in ("-m", "--multirun") for a in args)
    overrides = [a for a in args if a not in ("-m", "--multirun")]
    flags = [o for o in overrides if o.startswith("-")]
    if flags:
        raise BadInput(flags[0], "unknown option (overrides are KEY=VALUE; -m for a multirun)")
    jobs = expand_multirun(overrides) if multirun else [overrides]
    # Every job is composed, checked and planned before the first model loads.
    prepared = []
    for job in jobs:
        try:
            prepared.append(prepare(validate(compose_config(job))))
        except BadInput as exc:
            if multirun:
                raise BadInput(exc.where, f"{exc.message} (in job {' '.join(job) or '<defaults>'})") from exc
            raise
    # Consecutive jobs with the same model, engine and workers share one dispatcher.
    current: tuple[str, Dispatcher] | None = None
    try:
        for job in prepared:
            key = dispatcher_key(job.worker_spec, job.config.section("cluster"))
            if current is None or current[0] != key:
                if current is not None:
                    current[1].close()
                current = (key, open_for(job))
            print(execute(job, current[1]), flush=True)
    finally:
        if current is not None:
            current[1].close()
    return EXIT_OK


COMMANDS = {"run": _run}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return EXIT_OK if args else EXIT_BAD_INPUT
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"evalrun: unknown command {command!r}; expected one of {sorted(COMMANDS)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return COMMANDS[command](rest)
    except BadInput as exc:
        print(f"evalrun {command}: error: {exc.where}: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except CheckFailed as exc:
        print(f"evalrun {command}: check failed: {exc}", file=sys.stderr)
        return EXIT_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(main())
