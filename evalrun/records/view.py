"""One episode's chain, read: the one typed view of a chain's entries that every reader of chains uses
(the kinds' row checks in verify, replay's recording, check, the report's transcripts, the Inspect export).

A chain is a header, its entries and an end (docs/design.md "Chain entries"). Read as a conversation, its
policy acts in turns: a turn is a model call (absent for a scripted agent's turn), the tool calls of its
reply, each with the effects it read and the observation it returned, the observation answering a reply
that was not a tool-call reply, and the join of calls that ran together. The reads a world made while it
was generated (outside any tool call) stand before the first turn. A judge's calls and a multiple-choice
option's scores are model calls of the episode but no turn of its policy; nor is a simulated person's turn
played by a model (``role: user``), which belongs to the tool call that spoke to the person.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from evalrun.records.entries import (
    MODEL_CALLS,
    ClockEntry,
    EndEntry,
    Entry,
    EnvEntry,
    FailedCallEntry,
    HeaderEntry,
    JoinEntry,
    JudgeEntry,
    LoglikelihoodEntry,
    ModelEntry,
    ObservationEntry,
    RandomEntry,
    ToolEntry,
    UserEntry,
    UuidEntry,
)

EffectEntry = ClockEntry | RandomEntry | UuidEntry | EnvEntry
EFFECT_ENTRIES = (ClockEntry, RandomEntry, UuidEntry, EnvEntry)
ModelCall = ModelEntry | LoglikelihoodEntry | JudgeEntry | UserEntry | FailedCallEntry


def is_user_turn(entry: Entry) -> bool:
    """Whether a model call was a simulated person's turn (a reply, or a refused one), not the policy's."""
    return isinstance(entry, UserEntry) or (isinstance(entry, FailedCallEntry) and entry.role == "user")


@dataclass(frozen=True)
class ToolCallView:
    """One tool call: its request, the effects it read (in the order it read them), the simulated person's turn
    it led to (a model's reply, or its refusal; None: no person played by a model answered) and its result."""

    request: ToolEntry
    reads: tuple[EffectEntry, ...] = ()
    result: ObservationEntry | None = None
    user: UserEntry | FailedCallEntry | None = None


@dataclass(frozen=True)
class TurnView:
    """One turn of the episode's policy."""

    reply: ModelEntry | FailedCallEntry | None  # None: a scripted agent's turn (no model call)
    calls: tuple[ToolCallView, ...] = ()
    unread: ObservationEntry | None = None  # what the agent was shown for a reply that was no tool-call reply
    join: JoinEntry | None = None  # the calls of the reply that ran together, in the order they were recorded


@dataclass
class _Turn:
    reply: ModelEntry | FailedCallEntry | None
    calls: list[ToolCallView] = field(default_factory=list)
    unread: ObservationEntry | None = None
    join: JoinEntry | None = None

    def answered(self) -> bool:
        return self.unread is not None or self.join is not None or any(c.result is not None for c in self.calls)

    def frozen(self) -> TurnView:
        return TurnView(self.reply, tuple(self.calls), self.unread, self.join)


@dataclass(frozen=True)
class ChainView:
    """An episode's chain as typed parts (:meth:`of` its entries, in chain order)."""

    entries: tuple[Entry, ...]
    header: HeaderEntry
    end: EndEntry | None
    model_calls: tuple[ModelCall, ...]  # every model call, in chain order
    setup_reads: tuple[EffectEntry, ...]  # effects read outside any tool call (while a world was generated)
    turns: tuple[TurnView, ...]

    @property
    def generations(self) -> tuple[ModelEntry, ...]:
        """The policy's generations (a judge's are not), in call order."""
        return tuple(e for e in self.model_calls if isinstance(e, ModelEntry))

    @property
    def option_scores(self) -> tuple[LoglikelihoodEntry, ...]:
        return tuple(e for e in self.model_calls if isinstance(e, LoglikelihoodEntry))

    @property
    def user_turns(self) -> tuple[UserEntry, ...]:
        """A simulated person's replies played by a model, in call order."""
        return tuple(e for e in self.model_calls if isinstance(e, UserEntry))

    @property
    def judgements(self) -> tuple[JudgeEntry, ...]:
        return tuple(e for e in self.model_calls if isinstance(e, JudgeEntry))

    @property
    def refused(self) -> tuple[FailedCallEntry, ...]:
        return tuple(e for e in self.model_calls if isinstance(e, FailedCallEntry))

    @property
    def failure(self) -> str | None:
        """Why the episode failed, when its chain ends in an error (None: it did not)."""
        if self.end is None or self.end.status != "error":
            return None
        return self.end.error or ""

    @classmethod
    def of(cls, entries: Sequence[Entry]) -> ChainView:
        """The view of a chain's entries (as the run directory's reader gives them: a header first)."""
        header = entries[0]
        if not isinstance(header, HeaderEntry):
            raise ValueError(f"a chain starts with its header, not a {header.kind} entry")
        calls: list[ModelCall] = []
        setup: list[EffectEntry] = []
        turns: list[_Turn] = []
        pending: dict[int, list[EffectEntry]] = {}  # reads of a tool call whose observation is yet to come
        current: _Turn | None = None
        end: EndEntry | None = None
        for entry in entries[1:]:
            if isinstance(entry, MODEL_CALLS):
                calls.append(entry)
                if is_user_turn(entry):
                    assert isinstance(entry, UserEntry | FailedCallEntry)
                    if current is not None:
                        current.calls = [replace(c, user=entry) if c.request.call == entry.tool else c
                                         for c in current.calls]  # fmt: skip
                elif isinstance(entry, ModelEntry | FailedCallEntry):
                    current = _Turn(entry)
                    turns.append(current)
            elif isinstance(entry, ToolEntry):
                if current is None or current.answered():
                    current = _Turn(None)
                    turns.append(current)
                current.calls.append(ToolCallView(entry))
            elif isinstance(entry, EFFECT_ENTRIES):
                if entry.tool is None:
                    setup.append(entry)
                else:
                    pending.setdefault(entry.tool, []).append(entry)
            elif isinstance(entry, ObservationEntry):
                if entry.call is None:  # the answer to a reply that was no tool-call reply
                    if current is None or current.answered():
                        current = _Turn(None)
                        turns.append(current)
                    current.unread = entry
                elif current is not None:
                    current.calls = [
                        ToolCallView(c.request, tuple(pending.pop(entry.call, ())), entry, c.user)
                        if c.request.call == entry.call else c
                        for c in current.calls
                    ]  # fmt: skip
            elif isinstance(entry, JoinEntry) and current is not None:
                current.join = entry
            elif isinstance(entry, EndEntry):
                end = entry
        return cls(tuple(entries), header, end, tuple(calls), tuple(setup), tuple(t.frozen() for t in turns))
