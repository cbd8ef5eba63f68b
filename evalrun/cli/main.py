"""The ``evalrun`` command.

    evalrun run [-m] [KEY=VALUE ...]     Hydra overrides; -m sweeps (a=1,2) as one multirun
    evalrun verify RUN_DIR [--expect-root HEX] [--public-key PEM] [--jobs N]
                                         recompute chains, heads, root, digest, file hashes
    evalrun rescore RUN_DIR [KEY=VALUE ...]
                                         score stored outputs again (scorer overrides), no engine
    evalrun replay RUN_DIR [KEY=VALUE ...]
                                         re-run the harness on the recorded responses
    evalrun prove RUN_DIR EPISODE_ID [-o PROOF.json]
                                         audit path from one episode to the run's Merkle root
    evalrun verify-proof PROOF.json --root HEX
    evalrun attest RUN_DIR [--key PEM]   (re)write attestation.intoto.json, signed with --key
    evalrun resume RUN_DIR [cluster.KEY=VALUE ...]
                                         finish an interrupted run (keeps its complete parts)
    evalrun compare RUN_A RUN_B [--json] [--interval clustered|bootstrap]
                                         manifest diff, then paired B - A per task and overall
    evalrun digest RUN_DIR [--json]      the six-field release-gate record
    evalrun gate CANDIDATE BASELINE [--rule range|paired] [--factor F] [--metric M] [--json]
                                         exit 1 (blocked) unless digests match and the margin is beaten
    evalrun nondet RUN RUN [RUN ...] [--metric M] [--json]
                                         TARr/TARa, divergence, accuracy spread over equal-digest runs

The last line on stdout of ``run`` is the run directory (one line per job with -m). Exit codes:
0 success, 1 a check failed, 2 bad input or usage (the message names the file, field or line).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from evalrun.errors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK, BadInput, CheckFailed

USAGE = __doc__ or ""


def _run(args: list[str]) -> int:
    from evalrun.config import compose_config, expand_multirun, validate
    from evalrun.pipeline.dispatch import Dispatcher, dispatcher_key
    from evalrun.pipeline.runner import execute, open_for, prepare

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


def _resume(args: list[str]) -> int:
    from pathlib import Path

    from evalrun.pipeline.runner import resume

    if not args or args[0].startswith("-") or "=" in args[0]:
        raise BadInput("RUN_DIR", "usage: evalrun resume RUN_DIR [cluster.KEY=VALUE ...]")
    run_dir = Path(args[0])
    if not run_dir.is_dir():
        raise BadInput(str(run_dir), "no such run directory")
    print(resume(run_dir, args[1:]), flush=True)
    return EXIT_OK


COMMANDS = {"run": _run, "resume": _resume}


def _parser(command: str, run_dir: bool = True) -> Any:
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> Any:  # usage errors are exit 2 with a named field
            raise BadInput(command, f"{message}\n{self.format_usage().strip()}")

    parser = Parser(prog=f"evalrun {command}")
    if run_dir:
        parser.add_argument("run_dir", type=Path)
    return parser


def _verify(args: list[str]) -> int:
    from evalrun.audit.verify import verify_run

    parser = _parser("verify")
    parser.add_argument("--expect-root", help="a Merkle root kept elsewhere; the run's must equal it")
    parser.add_argument("--public-key", type=Path, help="PEM Ed25519 public key: check the attestation's signature")
    parser.add_argument("--jobs", type=int, default=0, help="processes for the parts (0: one per CPU)")
    ns = parser.parse_args(args)
    report = verify_run(ns.run_dir, expect_root=ns.expect_root, public_key=ns.public_key, jobs=ns.jobs)
    print(f"ok: {report.episodes} episodes, {report.log_entries} log entries, {report.parts} parts; "
          f"merkle root {report.merkle_root}; attestation {report.attestation}")  # fmt: skip
    return EXIT_OK


def _rescore(args: list[str]) -> int:
    from evalrun.audit.rescore import format_report, rescore_run

    parser = _parser("rescore")
    parser.add_argument("overrides", nargs="*", help="scorer fields, e.g. normalize=[strip,lower] or name=number")
    ns = parser.parse_args(args)
    print(format_report(rescore_run(ns.run_dir, ns.overrides)))
    return EXIT_OK


def _replay(args: list[str]) -> int:
    from evalrun.audit.replay import replay_run

    parser = _parser("replay")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. task.template=PATH")
    ns = parser.parse_args(args)
    report = replay_run(ns.run_dir, ns.overrides)
    for d in report.divergences[:10]:
        print(f"divergence: episode {d.episode} seq {d.seq}\n  expected: {d.expected}\n  got:      {d.got}")
    if report.divergences:
        first = report.divergences[0]
        raise CheckFailed(f"{len(report.divergences)} of {report.episodes} episodes diverge; first: "
                          f"episode {first.episode} seq {first.seq}")  # fmt: skip
    if not report.root_matches or not report.scores_identical:
        raise CheckFailed(f"heads reproduced but root matches: {report.root_matches}, "
                          f"scores identical: {report.scores_identical}")  # fmt: skip
    print(f"ok: {report.reproduced} episodes replayed; every head, the Merkle root and the scores reproduced")
    return EXIT_OK


def _prove(args: list[str]) -> int:
    from evalrun.audit.proofs import prove
    from evalrun.records.canonical import canonical_json

    parser = _parser("prove")
    parser.add_argument("episode_id")
    parser.add_argument("-o", "--output", type=Path, help="write the proof here instead of stdout")
    ns = parser.parse_args(args)
    text = canonical_json(prove(ns.run_dir, ns.episode_id).as_record())
    if ns.output:
        ns.output.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return EXIT_OK


def _verify_proof(args: list[str]) -> int:
    from evalrun.audit.proofs import check_proof, load_proof

    parser = _parser("verify-proof", run_dir=False)
    parser.add_argument("proof", type=Path)
    parser.add_argument("--root", required=True, help="the run's Merkle root, obtained independently")
    ns = parser.parse_args(args)
    proof = load_proof(ns.proof)
    check_proof(proof, ns.root)
    print(f"ok: episode {proof.episode_id} (head {proof.head}) is leaf {proof.leaf_index} of {proof.tree_size} "
          f"under root {ns.root}")  # fmt: skip
    return EXIT_OK


def _attest(args: list[str]) -> int:
    from evalrun.rundir.attest import write_attestation
    from evalrun.rundir.reader import load_record, open_run

    parser = _parser("attest")
    parser.add_argument("--key", type=Path, help="PEM Ed25519 private key to sign with")
    ns = parser.parse_args(args)
    run = open_run(ns.run_dir)
    print(write_attestation(run, load_record(run), ns.key))
    return EXIT_OK


COMMANDS.update(
    {"verify": _verify, "rescore": _rescore, "replay": _replay, "prove": _prove, "verify-proof": _verify_proof,
     "attest": _attest}
)  # fmt: skip


def _print_json(record: object) -> None:
    from evalrun.records.canonical import canonical_json

    print(canonical_json(record))


def _compare(args: list[str]) -> int:
    from evalrun.analysis.compare import compare_paths, format_report

    parser = _parser("compare", run_dir=False)
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--json", action="store_true", help="the full report as canonical JSON")
    parser.add_argument("--interval", choices=["clustered", "bootstrap"], default="clustered",
                        help="paired interval shown in the table (JSON holds both)")  # fmt: skip
    ns = parser.parse_args(args)
    report = compare_paths(ns.run_a, ns.run_b)
    if ns.json:
        _print_json(report.as_record())
    else:
        print(format_report(report, ns.interval))
    if report.warning:
        print(f"evalrun compare: {report.warning}", file=sys.stderr)
    return EXIT_OK


def _digest(args: list[str]) -> int:
    from evalrun.analysis.gate import digest_record, format_digest
    from evalrun.analysis.runs import load_run

    parser = _parser("digest")
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(args)
    record = digest_record(load_run(ns.run_dir))
    _print_json(record) if ns.json else print(format_digest(record))
    return EXIT_OK


def _gate(args: list[str]) -> int:
    from evalrun.analysis.gate import RULES, format_decision, gate_paths

    parser = _parser("gate", run_dir=False)
    parser.add_argument("candidate", type=Path)
    parser.add_argument("baseline", type=Path)
    parser.add_argument("--rule", choices=RULES, default="range", help="margin rule (default: range)")
    parser.add_argument("--factor", type=float, default=2.0, help="range rule: margin = FACTOR x pooled range")
    parser.add_argument("--interval", choices=["clustered", "bootstrap"], default="clustered",
                        help="paired rule: which 95%% interval")  # fmt: skip
    parser.add_argument("--metric", help="metric to gate on (default: the runs' only metric)")
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(args)
    if ns.factor <= 0:
        raise BadInput("--factor", f"expected a number > 0, got {ns.factor}")
    decision = gate_paths(ns.candidate, ns.baseline, rule=ns.rule, metric=ns.metric, factor=ns.factor,
                          interval=ns.interval)  # fmt: skip
    _print_json(decision.as_record()) if ns.json else print(format_decision(decision))
    if not decision.passed:
        raise CheckFailed(f"blocked: {decision.reason} [{decision.margin_rule}]")
    return EXIT_OK


def _nondet(args: list[str]) -> int:
    from evalrun.analysis.nondet import format_report, nondet_paths

    parser = _parser("nondet", run_dir=False)
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--metric", help="metric for TARa and accuracy (default: the runs' only metric)")
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(args)
    report = nondet_paths(ns.runs, ns.metric)
    _print_json(report.as_record()) if ns.json else print(format_report(report))
    return EXIT_OK


COMMANDS.update({"compare": _compare, "digest": _digest, "gate": _gate, "nondet": _nondet})


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
