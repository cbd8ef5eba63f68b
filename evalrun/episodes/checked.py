"""One part of a run checked against itself: every chain of its log part hashed and parsed, and each output row
against its chain as the run's kind of episode says (``EpisodeKind.row_mismatch``), or the common single-call case
on a fast path that parses no line. ``evalrun verify`` checks every part with it (evalrun.audit.verify, in worker
processes), and ``evalrun resume`` the parts it keeps before it builds on them (evalrun.pipeline.runner)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evalrun.episodes import EpisodeKind, kind_named
from evalrun.episodes.users import user_seed
from evalrun.errors import CheckFailed
from evalrun.records.canonical import canonical_json, sha256_hex
from evalrun.records.entries import EndEntry, Entry, HeaderEntry, ModelEntry, UserEntry
from evalrun.records.merkle import leaf_hash
from evalrun.records.single_call import check_single_call_part
from evalrun.records.view import ChainView, is_user_turn
from evalrun.rundir.reader import iter_chains, read_output_part


def _fail(where: str, message: str) -> CheckFailed:
    return CheckFailed(f"{where}: {message}")


@dataclass(frozen=True)
class PartResult:
    heads: dict[str, str]
    entries: int
    output_tokens: int
    # (episode_id, RFC 6962 leaf hash) sorted by episode id: the run's Merkle leaves, hashed where the part is
    leaves: list[tuple[str, bytes]] = field(default_factory=list)
    # sha256 of the part's files, of the very bytes checked (the whole-run check compares them to record.json)
    file_hashes: dict[str, str] = field(default_factory=dict)
    failed: frozenset[str] = frozenset()  # episodes whose chain ends with status error
    # the policy's sampling records, canonical JSON with the per-episode seed set to "0" (checked against
    # the manifest's decoding settings)
    samplings: frozenset[str] = frozenset()
    # likewise a model-played simulated user's (checked against the user decoding its world records)
    user_samplings: frozenset[str] = frozenset()


# --- one part: chains and output rows --------------------------------------------------------


def verify_part(run_path: str, log_rel: str, out_rel: str, kind: str) -> PartResult:
    """One part's checks; ``kind``: the run's kind of episode (its manifest's), which checks each output row
    against its chain."""
    root = Path(run_path)
    try:
        log_data, out_data = (root / log_rel).read_bytes(), (root / out_rel).read_bytes()
    except OSError:
        fast, hashes = None, {}
    else:
        fast = _verify_part_fast(log_data, out_data)
        hashes = {log_rel: sha256_hex(log_data), out_rel: sha256_hex(out_data)}
    part = fast if fast is not None else _verify_part_precise(root, log_rel, out_rel, kind_named(kind))
    leaves = sorted((eid, leaf_hash(eid, head)) for eid, head in part.heads.items())
    return PartResult(part.heads, part.entries, part.output_tokens, leaves, hashes, part.failed, part.samplings,
                      part.user_samplings)  # fmt: skip


def _verify_part_precise(root: Path, log_rel: str, out_rel: str, kind: EpisodeKind) -> PartResult:
    """Every check, entry by entry; raises naming the first broken thing."""
    chains = {}
    entries_count = 0
    samplings: set[str] = set()
    user_samplings: set[str] = set()
    for eid, entries, _lines, head, start in iter_chains(root / log_rel, log_rel):
        turns = 0  # the episode's simulated user's turns so far
        for entry in entries:
            if isinstance(entry, ModelEntry):
                samplings.add(canonical_json({**entry.request.sampling.as_record(), "seed": "0"}))
            elif isinstance(entry, UserEntry):
                _check_user_seed(entries[0], entry, turns, f"{log_rel}:{start + entry.seq}")
                user_samplings.add(canonical_json({**entry.request.sampling.as_record(), "seed": "0"}))
            if is_user_turn(entry):
                turns += 1
        if eid in chains:
            raise _fail(f"{log_rel}:{start}", f"episode {eid}: a second chain in the same part")
        chains[eid] = (entries, head, start)
        entries_count += len(entries)
    rows = read_output_part(root / out_rel, out_rel)
    heads: dict[str, str] = {}
    tokens = 0
    failed = set()
    for index, row in enumerate(rows):
        eid = row["episode_id"]
        where = f"{out_rel} row {index}"
        if eid in heads:
            raise _fail(where, f"episode {eid}: a second output row")
        if eid not in chains:
            raise _fail(where, f"episode {eid}: no chain in {log_rel}")
        entries, head, start = chains[eid]
        if row["head"] != head:
            raise _fail(where, f"episode {eid}: head {row['head']} differs from its chain's head {head} "
                               f"({log_rel}:{start})")  # fmt: skip
        column = kind.row_mismatch(row, ChainView.of(entries))
        if column is not None:
            raise _fail(where, f"episode {eid}: column {column!r} differs from the chain ({log_rel}:{start})")
        heads[eid] = head
        tokens += row["output_tokens"]
        end = entries[-1]
        if isinstance(end, EndEntry) and end.status == "error":
            failed.add(eid)
    for eid, (_entries, _head, start) in chains.items():
        if eid not in heads:
            raise _fail(f"{log_rel}:{start}", f"episode {eid}: chain without an output row in {out_rel}")
    return PartResult(heads=heads, entries=entries_count, output_tokens=tokens, failed=frozenset(failed),
                      samplings=frozenset(samplings), user_samplings=frozenset(user_samplings))  # fmt: skip


def _check_user_seed(header: Entry, entry: UserEntry, turn: int, where: str) -> None:
    """A simulated user's ``turn``-th reply's sampling seed derives from its episode's sampling seed (docs/design.md
    "Seeds")."""
    assert isinstance(header, HeaderEntry)
    expected = str(user_seed(int(header.seeds.sampling), turn))
    if entry.request.sampling.seed != expected:
        raise _fail(where, f"episode {entry.episode}: the simulated user's call {entry.call} samples with seed "
                           f"{entry.request.sampling.seed}, which does not derive from the episode's sampling seed "
                           f"({expected})")  # fmt: skip


# --- one part, fast path ---------------------------------------------------------------------


def _verify_part_fast(log_data: bytes, out_data: bytes) -> PartResult | None:
    """The common case (every chain a single call, :func:`evalrun.records.single_call.check_single_call_part`)
    without parsing a line; None sends the part down the precise path."""
    fast = check_single_call_part(log_data, out_data)
    if fast is None:
        return None
    return PartResult(heads=fast.heads, entries=fast.entries, output_tokens=fast.output_tokens,
                      samplings=fast.samplings)  # fmt: skip
