"""The batch-invariance canary (docs/nondeterminism.md "Canary", docs/design.md "Determinism layer").

A fixed needle prompt is generated alone, then inside batches of other fixed prompts (sizes
:data:`BATCH_SIZES`, the needle first, last or in between), greedy and seeded-sampled (temperature
1.0, a fixed seed per request); each time its token ids and chosen-token logprobs must equal, bit
for bit, those it got alone. An engine whose kernels depend on the batch fails it (on the CPU
machine: vLLM's split-KV attention, torch's one-row matmul under the hf engine; on GPUs, kernels
that split work by batch shape), and the record says where first.

It runs in each engine worker right after its engine is built (``determinism.canary``, default
true) and on demand (``evalrun canary``). The prompts are plain ASCII text that any tokenizer
handles, short enough (at most 72 characters) for small contexts; 10 engine calls of 8 tokens.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from evalrun.engines import Completion, Engine, GenerationRequest, RequestRejected, SamplingSpec
from evalrun.records.canonical import canonical_hash
from evalrun.records.formats import CANARY_FORMAT
from evalrun.records.seeds import derive_seed

NEEDLE = "The old lighthouse keeper counted 42 ships before dawn, and then he"
FILLERS = (
    "Hello.",
    "Rain fell on the quiet town all night.",
    "List three colours: red, green and",
    "Q: 17+25\nA:",
    "A short story about a cat who learned to read the stars and the tides",
    "Numbers: 3, 1, 4, 1, 5, 9, 2, 6,",
    "Why is the sky blue?",
    "The train left the station at 9:15 and arrived",
    "ok",
    "Once upon a time, in a small village by the sea, there lived a baker who",
    "def add(a, b):",
    "Water boils at 100 degrees",
    "The meeting notes say: budget approved, hiring paused, next review in",
    "x",
    "Mountains, rivers, forests; the map showed all of them and more",
)
BATCH_SIZES = (2, 4, 8, 16)
# Where the needle sits in each batch, per mode: first, last and in between. Batch 2 has it last, after a
# shorter prompt: where vLLM's CPU attention split a sequence over threads, that is the batch it showed in.
POSITIONS = {"greedy": {2: 1, 4: 0, 8: 4, 16: 15}, "sampled": {2: 1, 4: 3, 8: 0, 16: 7}}
MAX_TOKENS = 8
SEED_MASTER = 0  # the canary's own: its prompts and seeds are the same in every run and on every machine
MODES = ("greedy", "sampled")
TEMPERATURE = {"greedy": 0.0, "sampled": 1.0}


def _sampling(mode: str, prompt_index: int) -> SamplingSpec:
    """Prompt 0 is the needle: the same seed alone and in every batch; fillers get their own."""
    return SamplingSpec(
        temperature=TEMPERATURE[mode], top_p=1.0, top_k=0, max_tokens=MAX_TOKENS, stop=(),
        seed=derive_seed(SEED_MASTER, "canary", mode, prompt_index), logprobs=True,
    )  # fmt: skip


def _request(mode: str, prompt_index: int) -> GenerationRequest:
    prompt = NEEDLE if prompt_index == 0 else FILLERS[prompt_index - 1]
    return GenerationRequest(prompt=prompt, sampling=_sampling(mode, prompt_index))


def batch_layout(size: int, position: int) -> list[int]:
    """Prompt indices of a batch of ``size`` with the needle (0) at ``position`` among fillers 1..size-1."""
    fillers = list(range(1, size))
    return [*fillers[:position], 0, *fillers[position:]]


def definition_sha256() -> str:
    """Names this canary: two records with the same value ran the same prompts, seeds and batches."""
    return canonical_hash({
        "needle": NEEDLE, "fillers": list(FILLERS), "batch_sizes": list(BATCH_SIZES), "modes": list(MODES),
        "sampling": {mode: _sampling(mode, 0).as_record() for mode in MODES},
        "positions": {mode: {str(size): at for size, at in POSITIONS[mode].items()} for mode in MODES},
    })  # fmt: skip


@dataclass(frozen=True)
class Comparison:
    """The needle in a batch against the needle alone."""

    equal: bool  # token ids and logprobs bit for bit
    first_difference: int | None  # the first token index whose id or logprob differs (None: equal)
    differs_in: str | None  # "token_ids", "logprobs" or "length" (one sequence is a prefix of the other)
    max_abs_logprob_diff: float  # over the tokens both chose alike, before any token differs (0.0: equal)


def _same_bits(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return struct.pack("<d", a) == struct.pack("<d", b)


def compare(alone: Completion, batched: Completion) -> Comparison:
    """Token ids and logprobs of the needle in a batch against those it got alone, bitwise (pure)."""
    a_ids, b_ids = alone.token_ids, batched.token_ids
    shared = min(len(a_ids), len(b_ids))
    token_at = next((j for j in range(shared) if a_ids[j] != b_ids[j]), None)
    agree = shared if token_at is None else token_at  # tokens before this index are the same
    a_lps, b_lps = alone.logprobs, batched.logprobs
    logprob_at = next((j for j in range(min(agree, len(a_lps), len(b_lps))) if not _same_bits(a_lps[j], b_lps[j])),
                      None)  # fmt: skip
    worst = 0.0
    for j in range(min(agree, len(a_lps), len(b_lps))):
        x, y = a_lps[j], b_lps[j]
        if x is not None and y is not None:
            worst = max(worst, abs(x - y))
    candidates = [(j, kind) for j, kind in ((logprob_at, "logprobs"), (token_at, "token_ids")) if j is not None]
    if not candidates and len(a_ids) != len(b_ids):
        candidates.append((shared, "length"))
    if not candidates and len(a_lps) != len(b_lps):  # logprobs given for one and not the other
        candidates.append((min(len(a_lps), len(b_lps)), "logprobs"))
    if not candidates:
        return Comparison(equal=True, first_difference=None, differs_in=None, max_abs_logprob_diff=worst)
    first, kind = min(candidates)
    return Comparison(equal=False, first_difference=first, differs_in=kind, max_abs_logprob_diff=worst)


@dataclass(frozen=True)
class CanaryCheck:
    mode: str
    batch_size: int
    position: int  # the needle's index in the batch
    equal: bool
    first_difference: int | None
    differs_in: str | None
    max_abs_logprob_diff: float


@dataclass(frozen=True)
class CanaryMismatch:
    mode: str
    batch_size: int
    position: int
    token_index: int
    differs_in: str


@dataclass(frozen=True)
class CanaryResult:
    invariant: bool
    modes: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    max_tokens: int
    needle_tokens: dict[str, int]  # per mode: tokens the needle generated alone (what each check compares)
    max_abs_logprob_diff: float  # 0.0: every logprob bitwise equal
    first_mismatch: CanaryMismatch | None
    checks: tuple[CanaryCheck, ...]
    engine_calls: int
    seconds: float
    definition_sha256: str

    def as_record(self) -> dict[str, Any]:
        mismatch = self.first_mismatch
        return {
            "format": CANARY_FORMAT,
            "invariant": self.invariant,
            "modes": list(self.modes),
            "batch_sizes": list(self.batch_sizes),
            "max_tokens": self.max_tokens,
            "needle_tokens": dict(self.needle_tokens),
            "max_abs_logprob_diff": self.max_abs_logprob_diff,
            "first_mismatch": None if mismatch is None else {
                "mode": mismatch.mode, "batch_size": mismatch.batch_size, "position": mismatch.position,
                "token_index": mismatch.token_index, "differs_in": mismatch.differs_in,
            },
            "checks": [
                {"mode": c.mode, "batch_size": c.batch_size, "position": c.position, "equal": c.equal,
                 "first_difference": c.first_difference, "differs_in": c.differs_in,
                 "max_abs_logprob_diff": c.max_abs_logprob_diff}
                for c in self.checks
            ],
            "engine_calls": self.engine_calls,
            "seconds": self.seconds,
            "definition_sha256": self.definition_sha256,
        }  # fmt: skip


def run_canary(engine: Engine, clock: Callable[[], float] = time.perf_counter) -> CanaryResult:
    """Run the canary on ``engine``; :class:`RequestRejected` if it refuses the canary's prompts."""
    started = clock()
    calls = 0
    checks: list[CanaryCheck] = []
    needle_tokens: dict[str, int] = {}
    for mode in MODES:
        (alone,) = engine.generate([_request(mode, 0)])
        calls += 1
        needle_tokens[mode] = len(alone.token_ids)
        for size in BATCH_SIZES:
            position = POSITIONS[mode][size]
            batch = engine.generate([_request(mode, index) for index in batch_layout(size, position)])
            calls += 1
            c = compare(alone, batch[position])
            checks.append(CanaryCheck(mode, size, position, c.equal, c.first_difference, c.differs_in,
                                      c.max_abs_logprob_diff))  # fmt: skip
    failed = next((c for c in checks if not c.equal), None)
    mismatch = None
    if failed is not None:
        assert failed.first_difference is not None and failed.differs_in is not None
        mismatch = CanaryMismatch(failed.mode, failed.batch_size, failed.position, failed.first_difference,
                                  failed.differs_in)  # fmt: skip
    worst = max(c.max_abs_logprob_diff for c in checks)
    return CanaryResult(
        invariant=failed is None, modes=MODES, batch_sizes=BATCH_SIZES, max_tokens=MAX_TOKENS,
        needle_tokens=needle_tokens, max_abs_logprob_diff=worst, first_mismatch=mismatch, checks=tuple(checks),
        engine_calls=calls, seconds=round(clock() - started, 3), definition_sha256=definition_sha256(),
    )  # fmt: skip


def canary_at_start(engine: Any, enabled: bool, stand_in: bool) -> tuple[CanaryResult | None, str | None]:
    """The canary a worker runs after building its engine, or None and the reason it did not run
    (None, None when ``determinism.canary`` is false): a stand-in engine (``engine_factory``, e.g.
    the dispatch benchmark's) is not the engine a run is about, an engine without generation has
    nothing to check, and an engine that refuses the canary's prompts (a context shorter than 81
    tokens) leaves the worker serving: the reason goes to the worker's determinism notes."""
    if not enabled:
        return None, None
    if stand_in:
        return None, "determinism.canary: not run: the engine is a stand-in (WorkerSpec.engine_factory)"
    if not callable(getattr(engine, "generate", None)):
        return None, "determinism.canary: not run: the engine does not generate"
    try:
        return run_canary(engine), None
    except NotImplementedError:
        return None, "determinism.canary: not run: the engine does not generate"
    except RequestRejected as exc:
        return None, f"determinism.canary: not run: the engine refused its prompts ({exc})"


def describe(result: CanaryResult) -> str:
    """The verdict in one line."""
    sizes = ",".join(map(str, result.batch_sizes))
    if result.invariant:
        return (f"batch-invariant: the needle's tokens and logprobs are bitwise equal alone and in batches of "
                f"{sizes} ({', '.join(result.modes)}; {len(result.checks)} checks)")  # fmt: skip
    return failure_line(result.as_record())  # one wording, live or read back from a run's record


# --- the verdict as a run records it (the manifest's workers[].canary, record.json's dispatch.workers) --------


def record_failed(record: Any) -> bool:
    """Whether a recorded canary (``CanaryResult.as_record()``) says the engine is not batch-invariant; a
    canary that did not run (None) or a run made before the canary (no record) failed nothing."""
    return isinstance(record, Mapping) and record.get("invariant") is False


def failure_line(record: Mapping[str, Any]) -> str:
    """A failed canary's record in one line: how many checks differed, the largest |dlogprob|, the batch
    sizes compared (the needle alone, batch size 1, against each batch) and the first mismatch. Read from
    the record alone, so that a run's stored record says it the same way whenever it is read."""
    checks = [c for c in record.get("checks") or [] if isinstance(c, Mapping)]
    differ = sum(c.get("equal") is not True for c in checks)
    sizes = ", ".join(map(str, record.get("batch_sizes") or [])) or "?"
    worst = record.get("max_abs_logprob_diff")
    worst_text = f"{worst:.3e}" if isinstance(worst, int | float) else "?"
    m = record.get("first_mismatch")
    first = (f"; first: {m.get('mode')}, batch size {m.get('batch_size')}, needle at {m.get('position')}, token "
             f"{m.get('token_index')} ({m.get('differs_in')})") if isinstance(m, Mapping) else ""  # fmt: skip
    return (f"NOT batch-invariant: {differ} of {len(checks)} canary checks differ, max |dlogprob| {worst_text} "
            f"(batch size 1 against {sizes}){first}")  # fmt: skip


def recorded_canaries(*worker_lists: Iterable[Any]) -> list[tuple[str, Any]]:
    """(worker, canary record or None) for each worker named in ``worker_lists`` (the manifest's ``workers``,
    then record.json's ``dispatch.workers``, which adds workers that replaced others mid-run), each once, in
    order; a worker listed without a ``canary`` key (made before the canary) is left out."""
    seen: dict[str, Any] = {}
    for workers in worker_lists:
        for w in workers or []:
            if isinstance(w, Mapping) and "canary" in w and str(w.get("worker")) not in seen:
                seen[str(w.get("worker"))] = w["canary"]
    return list(seen.items())


def failure_lines(manifest: Mapping[str, Any], record: Mapping[str, Any] | None = None) -> list[str]:
    """One line per worker whose recorded canary failed (``worker W: NOT batch-invariant: ...``), from a run's
    manifest and record.json (either may lack the workers: a run made before the canary has none)."""
    dispatch = (record or {}).get("dispatch")
    later = dispatch.get("workers") if isinstance(dispatch, Mapping) else None
    recorded = recorded_canaries(manifest.get("workers") or [], later or [])
    return [f"worker {worker}: {failure_line(c)}" for worker, c in recorded if record_failed(c)]
