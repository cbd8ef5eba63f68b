"""``evalrun verify GROUP_DIR``: a group's record (evalrun.pipeline.groups) checked against its tasks' runs.

Every task's run is verified as any run is (evalrun.audit.verify); its digest, Merkle root and seal must be the ones
group.json records; the group's results are recomputed from the tasks' (verified) summaries with the group as
recorded; the record's seal is recomputed; and the directory may hold nothing else than the record, the group's
config.yaml and the tasks' runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalrun.audit.verify import VerifyReport, verify_run
from evalrun.errors import CheckFailed
from evalrun.pipeline.groups import GROUP_FORMAT, group_results
from evalrun.records.canonical import canonical_hash
from evalrun.rundir import layout
from evalrun.rundir.reader import read_summary
from evalrun.tasks.lm_eval_groups import Group


@dataclass(frozen=True)
class GroupVerifyReport:
    group: Path
    name: str
    seal: str
    tasks: Mapping[str, VerifyReport] = field(default_factory=dict)


def _fail(where: Path, message: str) -> CheckFailed:
    return CheckFailed(f"{where}: {message}")


def verify_group(path: Path, public_key: Path | None = None, jobs: int = 0) -> GroupVerifyReport:
    """Check the group at ``path``; raises CheckFailed naming the first broken thing."""
    record_path = path / layout.GROUP
    if not record_path.is_file():
        done = sorted(p.name for p in path.iterdir() if (p / layout.RECORD).is_file())
        raise _fail(record_path, f"missing: the group is incomplete (tasks finished: {', '.join(done) or 'none'}); "
                                 f"`evalrun resume {path}` finishes it")  # fmt: skip
    record = _load(record_path)
    body = {k: v for k, v in record.items() if k != "seal"}
    if canonical_hash(body) != record.get("seal"):
        raise _fail(record_path, f"seal {record.get('seal')} is not the sha256 of the record {canonical_hash(body)}")
    group = Group.from_record(record["group"])
    members = record["members"]
    names = [m["task"] for m in members]
    if names != [leaf.name for leaf in group.leaves()]:
        raise _fail(record_path, f"members {names} are not the group's tasks {[x.name for x in group.leaves()]}")
    allowed = {*names, layout.GROUP, layout.CONFIG, layout.REPORT}  # a report: a view, never part of it
    strays = sorted(p.name for p in path.iterdir() if p.name not in allowed)
    if strays:
        raise _fail(path / strays[0], "not part of the group's record")
    reports, summaries = {}, {}
    for member in members:
        run_dir = path / member["run"]
        if member["run"] != member["task"]:
            raise _fail(record_path, f"task {member['task']}: its run is {member['run']!r}, not its own directory")
        report = verify_run(run_dir, public_key=public_key, jobs=jobs)
        for key, value in (("digest", report.digest), ("merkle_root", report.merkle_root), ("seal", report.seal)):
            if member.get(key) != value:
                raise _fail(record_path, f"task {member['task']}: {key} {member.get(key)} differs from its run's "
                                         f"{value}")  # fmt: skip
        summary = read_summary(layout.RunDir(run_dir))
        if set(summary.get("tasks", {})) != {member["task"]}:
            raise _fail(run_dir, f"runs task(s) {sorted(summary.get('tasks', {}))}, not {member['task']!r}")
        reports[member["task"]], summaries[member["task"]] = report, summary
    recomputed = group_results(group, summaries)
    if recomputed != record["results"]:
        changed = next(name for name in {**recomputed, **record["results"]}
                       if recomputed.get(name) != record["results"].get(name))  # fmt: skip
        raise _fail(
            record_path,
            f"results of {changed!r} differ from those recomputed from its tasks' runs: "
            f"{record['results'].get(changed)} recorded, {recomputed.get(changed)} recomputed",
        )
    return GroupVerifyReport(path, group.name, str(record["seal"]), reports)


def _load(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise _fail(path, f"not a readable group record ({exc})") from exc
    if not isinstance(record, dict) or record.get("format") != GROUP_FORMAT:
        raise _fail(path, f"expected a {GROUP_FORMAT} record")
    for key in ("group", "members", "results", "seal"):
        if key not in record:
            raise _fail(path, f"has no {key!r}")
    return record
