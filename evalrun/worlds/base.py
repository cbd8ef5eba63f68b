"""The world interface of agent episodes (issue 12).

A world is a small simulated environment an agent acts in through tool calls, Gymnasium-like:
``reset`` builds it from the task's seed and returns the task text, ``call`` answers one tool call,
``done`` is set by the world's submit tool, and a pure module-level verifier scores the
``final_state`` (which carries the ground truth and the submission, so scoring never re-runs a world).

Only the model may vary between two runs of an episode. So a world generates everything from the
task seed (its own generators, seeded at reset) and reads whatever could vary at run time, its
clock, random draws, ids and environment, through :class:`Effects` only: the harness wraps it with
a recorder on a live run and serves it from the recorded schedule on replay. A world never reads
the machine clock, ``random``, ``uuid`` or ``os.environ`` itself.

Bad calls (unknown tool, missing, unknown or wrongly typed arguments, any call after ``done``) are
answered with an error :class:`ToolResult`, never an exception: the agent sees the error as its
observation. An exception out of ``call`` is a bug of the world (or :class:`NetworkUsed
<evalrun.worlds.guard.NetworkUsed>`) and fails the episode loudly.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import uuid as uuid_module
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from random import Random
from typing import Any, ClassVar, Literal, Protocol, cast

from evalrun.config.registry import Registry
from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_hash, file_sha256
from evalrun.records.entries import HeaderEntry
from evalrun.records.seeds import derive_rng, derive_seed
from evalrun.records.view import ToolCallView
from evalrun.rundir import references
from evalrun.worlds.guard import world_guard

JSON = Any  # a JSON value: None, bool, int, float, str, list, dict with str keys
MAX_RANDOM_BITS = 53  # a draw is recorded as a JSON number: at most 2**53 - 1 (canonical JSON's safe range)

# ---------------------------------------------------------------------------------------------- tools


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, what it does, and its arguments as a JSON-schema-like object.

    ``parameters`` is ``{"type": "object", "properties": {arg: schema}, "required": [args]}``;
    a schema has ``type`` (string, integer, number, boolean, array, object) and optionally
    ``description``, ``items`` (array) or ``properties``/``required`` (object). No other argument
    is accepted: the checker in :func:`check_arguments` is strict so the agent learns the format.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}


def tools_hash(specs: Iterable[ToolSpec]) -> str:
    """Canonical hash of the tool definitions, in the order given (the order the agent is shown)."""
    return canonical_hash([spec.as_json() for spec in specs])


def object_schema(properties: Mapping[str, Mapping[str, Any]], required: Sequence[str] = ()) -> dict[str, Any]:
    """The ``parameters`` of a tool: an object with these properties, ``required`` of them mandatory."""
    return {"type": "object", "properties": dict(properties), "required": list(required)}


TODAY = ToolSpec("today", "Today's date.", object_schema({}))
"""A tool every world offers, answered by :meth:`World.today`; it reads the world's clock."""

_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def check_value(schema: Mapping[str, Any], value: Any, where: str) -> str | None:
    """The first way ``value`` breaks ``schema`` as a message naming ``where``, or None if it fits."""
    kind = schema.get("type", "object")
    if not _TYPES[kind](value):
        return f"{where} must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}, got {type(value).__name__}"
    if kind == "array" and "items" in schema:
        for i, element in enumerate(value):
            if problem := check_value(schema["items"], element, f"{where}[{i}]"):
                return problem
    if kind == "object":
        properties: Mapping[str, Any] = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                return f"{where} lacks the required argument {name!r}"
        for name, item in value.items():
            if name not in properties:
                return f"{where} has an unknown argument {name!r} (expected {sorted(properties)})"
            if problem := check_value(properties[name], item, f"{where}.{name}"):
                return problem
    return None


def check_arguments(spec: ToolSpec, arguments: Any) -> str | None:
    """Why ``arguments`` do not fit the tool ``spec`` (a message for the agent), or None."""
    return check_value(spec.parameters, arguments, f"{spec.name} arguments")


# -------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ToolResult:
    """What one tool call returns to the agent: ``ok`` with a JSON value, or ``error`` with a message."""

    status: Literal["ok", "error"]
    content: JSON

    def as_json(self) -> dict[str, Any]:
        return {"status": self.status, "content": self.content}

    @classmethod
    def ok(cls, content: JSON) -> ToolResult:
        return cls("ok", content)

    @classmethod
    def error(cls, message: str) -> ToolResult:
        return cls("error", message)


class ToolError(Exception):
    """Raised by a tool handler for a bad request (unknown id, ...): becomes an error ToolResult."""


# ---------------------------------------------------------------------------------------- simulated users


@dataclass(frozen=True)
class UserTurn:
    """A simulated user's turn, for a model to play (``task.world.user=model``): what the world seeded of the
    user (``facts``: persona and goal, which the user's prompt pack renders) and the conversation so far as
    ``(speaker, text)`` pairs, speaker ``user`` or ``agent``, the agent's message being answered last."""

    facts: Mapping[str, Any]
    messages: tuple[tuple[str, str], ...]


# -------------------------------------------------------------------------------------------- effects


class Effects(Protocol):
    """Everything a world reads at run time that could vary. The harness records (live) or serves
    (replay) each read; a world reads nothing of the kind any other way."""

    def clock(self) -> float:
        """The world's simulated wall clock, seconds since the epoch."""
        ...

    def random(self, purpose: str, bits: int) -> int:
        """A random integer of ``bits`` bits (1 to 53) from the stream of ``purpose``."""
        ...

    def uuid(self) -> str:
        """A fresh id: lowercase uuid4 text."""
        ...

    def env(self, name: str) -> str | None:
        """An environment setting of the world (never the process environment)."""
        ...


def check_bits(bits: int) -> None:
    if not 1 <= bits <= MAX_RANDOM_BITS:
        raise ValueError(f"random draws have 1 to {MAX_RANDOM_BITS} bits (JSON's safe integers), got {bits}")


class SeededEffects:
    """The live source of effects: deterministic from a seed, so a live run is reproducible too.

    The clock starts at ``start`` (the task's date and time) and advances by ``tick`` seconds per
    read, never by the machine's clock. Random draws come from one ``derive_rng`` stream per
    purpose; uuids from a stream of their own; ``env`` from the fixed mapping given here.
    Thread-safe: parallel tool calls may read it at once (the recorder decides the recorded order).
    """

    def __init__(self, start: float, tick: float, seed: int, env: Mapping[str, str] | None = None) -> None:
        if tick < 0:
            raise ValueError(f"the clock never goes back: tick must be >= 0, got {tick}")
        if not 0 <= seed < 2**MAX_RANDOM_BITS:
            raise ValueError(f"the effects seed is a JSON-safe integer (0 to 2**53 - 1), got {seed}")
        self.start = start
        self.tick = tick
        self.seed = seed
        self._env = dict(env or {})
        self._reads = 0
        self._streams: dict[str, Random] = {}
        self._uuids = derive_rng(seed, "effects.uuid")
        self._lock = threading.Lock()

    def clock(self) -> float:
        with self._lock:
            now = self.start + self._reads * self.tick
            self._reads += 1
            return now

    def random(self, purpose: str, bits: int) -> int:
        check_bits(bits)
        with self._lock:
            stream = self._streams.get(purpose)
            if stream is None:
                stream = self._streams[purpose] = derive_rng(self.seed, "effects.random", purpose)
            return stream.getrandbits(bits)

    def uuid(self) -> str:
        with self._lock:
            value = self._uuids.getrandbits(128)
        return str(uuid_module.UUID(int=value, version=4))

    def env(self, name: str) -> str | None:
        return self._env.get(name)

    def fork(self, key: int) -> SeededEffects:
        """The effects of one tool call (``key``: its number in the episode): streams of its own,
        derived from this seed and the key, and a clock that starts ``key`` ticks after this one's
        start, so what a call reads never depends on which calls ran before it or beside it."""
        seed = derive_seed(self.seed, "effects.call", key) >> (64 - MAX_RANDOM_BITS)
        return SeededEffects(self.start + key * self.tick, self.tick, seed, self._env)


# ----------------------------------------------------------------------------------------------- tasks


def parse_start(text: str, where: str = "start") -> float:
    """Seconds since the epoch of an ISO 8601 date-time; one without a zone is UTC."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (TypeError, ValueError):
        raise BadInput(where, f"expected an ISO 8601 date-time such as 2024-03-15T09:00:00Z, got {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def format_date(seconds: float) -> str:
    """The UTC date of a clock reading, ``YYYY-MM-DD``."""
    return datetime.fromtimestamp(seconds, timezone.utc).date().isoformat()


@dataclass(frozen=True)
class WorldTask:
    """One episode's task: which world (name and version), which family, the seed the world is
    generated from, the item id it is reported under, and its simulated start time and clock tick."""

    world: str
    version: str
    family: str
    seed: int
    item_id: str
    start: str  # ISO 8601 date-time, e.g. 2024-03-15T09:00:00Z
    tick: float = 1.0  # simulated seconds per clock read
    split: str = ""

    @property
    def start_seconds(self) -> float:
        return parse_start(self.start, "task.start")

    def as_json(self) -> dict[str, Any]:
        return {
            "world": self.world,
            "version": self.version,
            "family": self.family,
            "seed": self.seed,
            "item_id": self.item_id,
            "start": self.start,
            "tick": self.tick,
            "split": self.split,
        }


def effects_for(task: WorldTask, env: Mapping[str, str] | None = None) -> SeededEffects:
    """The live effects of ``task``: its start time and tick, a seed derived from the task seed."""
    seed = derive_seed(task.seed, "effects", task.family) >> (64 - MAX_RANDOM_BITS)  # a JSON-safe integer
    return SeededEffects(task.start_seconds, task.tick, seed, env)


# ----------------------------------------------------------------------------------------------- world

Verifier = Callable[[Mapping[str, Any]], dict[str, float]]
Handler = Callable[..., JSON]


class World(ABC):
    """A world: subclasses set the class attributes, build themselves in :meth:`reset`, list their
    tools and a handler per tool, and give their final state. :meth:`call` checks every call
    against the tool's spec before the handler sees it.

    A call of a tool that changes the world holds the world's lock; the tools listed in
    :attr:`concurrent_tools` only read it and run without, so the harness runs a reply's calls of
    them at once. Each call reads through its own effects (:meth:`SeededEffects.fork`), so what it
    reads does not depend on the order the calls run in.
    """

    name: ClassVar[str]
    version: ClassVar[str]
    tools_version: ClassVar[str]
    verifier_version: ClassVar[str]
    families: ClassVar[tuple[str, ...]]
    verifier: ClassVar[Verifier]  # the module-level verify function, as a staticmethod
    # Tools that only read the world: a reply's calls of them may run at once (without the lock).
    concurrent_tools: ClassVar[frozenset[str]] = frozenset()
    # Tools whose result is a simulated user's reply (support-desk's send_message). The world's own user answers
    # them in :meth:`call`; a user played by a model (``task.world.user=model``) answers between :meth:`ask_user`
    # and :meth:`user_replied`, which the world implements through :meth:`user_turn` and :meth:`user_reply`.
    user_tools: ClassVar[frozenset[str]] = frozenset()
    # The prompt pack a model plays the world's user with, unless the task names another (task.world.user_prompt);
    # None: the world has no user a model can play
    user_pack: ClassVar[Path | None] = None
    # The user tool a model agent's plain reply is said through: a reply that holds no tool call is this tool's
    # ``message`` (tau-bench's "respond"), so an agent talks to the user as a chat model talks; None: such a reply
    # is an error the agent is shown
    reply_tool: ClassVar[str | None] = None

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()  # the effects of the call running on this thread
        self._task: WorldTask | None = None
        self._effects: Effects | None = None
        self._world_hash: str | None = None
        self._done = False

    # -- to implement

    @abstractmethod
    def generate(self, task: WorldTask) -> str:
        """Build the world from ``task.seed`` (no effects read) and return the task text."""

    @abstractmethod
    def tools(self) -> list[ToolSpec]:
        """The tool specs, in the order the agent is shown them; independent of the generated world."""

    @abstractmethod
    def handlers(self) -> Mapping[str, Handler]:
        """Tool name -> handler taking the (checked) arguments as keywords, returning the ok content."""

    @abstractmethod
    def generated(self) -> JSON:
        """The generated world as JSON (hashed by :meth:`world_hash` right after reset)."""

    @abstractmethod
    def final_state(self) -> dict[str, Any]:
        """Everything the verifier needs, ground truth and submission included, as JSON."""

    # -- the interface

    def reset(self, task: WorldTask, effects: Effects) -> str:
        """Generate the world of ``task`` and return the task text the agent sees."""
        if (task.world, task.version) != (self.name, self.version):
            raise BadInput("task.world", f"{self.name}@{self.version} cannot run a {task.world}@{task.version} task")
        if task.family not in self.families:
            raise BadInput("task.family", f"expected one of {self.families}, got {task.family!r}")
        with self._lock:
            self._task, self._effects, self._done = task, effects, False
            text = self.generate(task)
            self._world_hash = canonical_hash(self.generated())
        return text

    def call(self, name: str, arguments: Any, effects: Effects | None = None) -> ToolResult:
        """Answer one tool call; a bad call is an error result, never an exception.

        ``effects``: what this call reads through (the harness gives each call its own); by default
        the effects given at reset. A tool in :attr:`concurrent_tools` runs without the world's
        lock, so several of them may run at once; any other tool holds it.
        """
        if self._task is None:
            raise RuntimeError(f"{self.name}: call before reset")
        with contextlib.nullcontext() if name in self.concurrent_tools else self._lock:
            self._local.effects = effects
            try:
                return self._answer(name, arguments)
            finally:
                self._local.effects = None

    def _answer(self, name: str, arguments: Any) -> ToolResult:
        if (refused := self._refusal(name, arguments)) is not None:
            return refused
        try:
            return ToolResult.ok(self.handlers()[name](**arguments))
        except ToolError as exc:
            return ToolResult.error(str(exc))

    def _refusal(self, name: str, arguments: Any) -> ToolResult | None:
        """The error result of a call that cannot be made (after the end, an unknown tool, bad arguments)."""
        if self._done:
            return ToolResult.error("the episode is over: the report was submitted")
        spec = next((s for s in self.tools() if s.name == name), None)
        if spec is None:
            return ToolResult.error(f"unknown tool {name!r}; the tools are {[s.name for s in self.tools()]}")
        if problem := check_arguments(spec, arguments):
            return ToolResult.error(problem)
        return None

    # -- a simulated user played by a model

    def ask_user(self, name: str, arguments: Any, effects: Effects | None = None) -> ToolResult | UserTurn:
        """The first half of a call of one of :attr:`user_tools` when a model plays the user: the call checked as
        :meth:`call` checks it (a bad one is its error result, and the user is not asked), then the world's
        :meth:`user_turn`: what the model playing the user is shown."""
        if self._task is None:
            raise RuntimeError(f"{self.name}: call before reset")
        with self._lock:
            self._local.effects = effects
            try:
                if (refused := self._refusal(name, arguments)) is not None:
                    return refused
                try:
                    return self.user_turn(name, dict(arguments))
                except ToolError as exc:
                    return ToolResult.error(str(exc))
            finally:
                self._local.effects = None

    def user_replied(self, text: str, ended: bool, effects: Effects | None = None) -> ToolResult:
        """The second half: the user's reply (``ended``: the user ended the conversation) taken by the world's
        :meth:`user_reply`, whose content is the tool call's result."""
        with self._lock:
            self._local.effects = effects
            try:
                return ToolResult.ok(self.user_reply(text, ended))
            finally:
                self._local.effects = None

    def user_turn(self, name: str, arguments: dict[str, Any]) -> UserTurn:
        """A call of a user tool, taken (the agent's message recorded), and the user's turn it asks for."""
        raise NotImplementedError(f"{self.name} has no user a model can play")

    def user_reply(self, text: str, ended: bool) -> JSON:
        """The user's reply taken (the conversation ends when ``ended``, or when the world says so): the result."""
        raise NotImplementedError(f"{self.name} has no user a model can play")

    @classmethod
    def user_said(cls, content: JSON) -> str | None:
        """What the user said in a user tool's ok result (the Inspect export's user message); None: nothing."""
        return None

    @property
    def effects(self) -> Effects:
        """What the running call reads through: its own effects, else the reset's."""
        own = getattr(self._local, "effects", None)
        if own is not None:
            return cast(Effects, own)
        if self._effects is None:
            raise RuntimeError(f"{self.name}: effects read before reset")
        return self._effects

    @property
    def task(self) -> WorldTask:
        if self._task is None:
            raise RuntimeError(f"{self.name}: no task before reset")
        return self._task

    @property
    def done(self) -> bool:
        return self._done

    def finish(self) -> None:
        """Called by the submit tool's handler: the episode ends."""
        self._done = True

    def today(self) -> JSON:
        """The ``today`` tool every world offers (:data:`TODAY`): the date of the world's clock."""
        return {"date": format_date(self.effects.clock())}

    def state_identity(self) -> dict[str, Any]:
        """What every final state starts with: which world and version made it, for which task, and
        the generated world's hash (so a verifier is found, and a state matched to its world)."""
        return {"world": {"name": self.name, "version": self.version}, "task": self.task.as_json(),
                "world_hash": self.world_hash(), "done": self.done}  # fmt: skip

    def world_hash(self) -> str:
        """Canonical hash of the generated world, taken right after reset."""
        if self._world_hash is None:
            raise RuntimeError(f"{self.name}: no world before reset")
        return self._world_hash

    @classmethod
    def frozen_reference(cls, task: WorldTask) -> dict[str, Any] | None:
        """The reference record of ``task`` for a world whose answers its own code computes (a
        ground truth), frozen by ``evalrun references build`` and recomputed by ``check``; None for a
        world without, or one whose references a solver computes (:mod:`evalrun.worlds.reference_sets`)."""
        return None

    @classmethod
    def check_references(cls, tasks: Sequence[WorldTask]) -> dict[str, str] | None:
        """Check that every task's frozen reference is there and matches (BadInput otherwise), before any
        model loads; the reference set's record (name, version, index hash), or None for a world with none."""
        return None

    @classmethod
    def versions(cls) -> dict[str, str]:
        """World name and version, tool-set version and hash, verifier version (what the episode header records),
        and the sha256 of the verifier's source (:meth:`verifier_source_sha256`), which the scoring digest covers
        so that a verifier edited without a version bump changes it."""
        return {
            "name": cls.name,
            "world": cls.version,
            "tools": cls.tools_version,
            "tools_hash": tools_hash(cls().tools()),
            "verifier": cls.verifier_version,
            "verifier_source": cls.verifier_source_sha256(),
        }

    @classmethod
    def verifier_source_sha256(cls) -> str:
        """sha256 over the source files the verifier is read from: the world's module and the module defining its
        ``verifier`` (by file name, so a moved checkout hashes the same)."""
        return _sources_sha256(
            frozenset(Path(inspect.getsourcefile(obj) or "").resolve() for obj in (cls, cls.verifier))
        )


@cache
def _sources_sha256(files: frozenset[Path]) -> str:  # read once a process: the header of every episode has it
    return canonical_hash({path.name: file_sha256(path) for path in sorted(files)})


# -------------------------------------------------------------------------------------------- registry

WORLDS: Registry[type[World]] = Registry("world", field="world")


class ComputedReferences:
    """A world whose references its own code computes (invoice-desk's ground truths, support-desk's expected
    outcomes): ``compute_reference`` makes a task's record (``instance_sha256`` and ``reference_key`` among its
    fields), frozen by ``evalrun references build`` and checked here. Listed before :class:`World` in the bases."""

    name: ClassVar[str]
    version: ClassVar[str]
    reference_key: ClassVar[str]
    compute_reference: ClassVar[Callable[[WorldTask], dict[str, Any]]]

    @classmethod
    def frozen_reference(cls, task: WorldTask) -> dict[str, Any] | None:
        return cls.compute_reference(task)

    @classmethod
    def check_references(cls, tasks: Sequence[WorldTask], root: Path | None = None) -> dict[str, str] | None:
        """Every task's frozen reference is there, untouched, made for the world the task generates, and its
        ``reference_key`` still what the world's code computes (else the world changed without a new version);
        BadInput otherwise, before any model loads. The set's record for the manifest."""
        key = cls.reference_key
        index = references.load_index(cls.name, cls.version, root)
        for task in tasks:
            computed = cls.compute_reference(task)
            stored = references.load_reference(index, task.item_id, computed["instance_sha256"])
            if stored.get(key) != computed[key]:
                raise BadInput(f"{index.path(task.item_id)}: {key}", f"frozen {stored.get(key)}, the world's code "
                               f"now computes {computed[key]}: a changed world needs a new version")  # fmt: skip
        return index.record()


def world_key(name: str, version: str) -> str:
    """Registry key of one version of a world: versions of one world live side by side."""
    return f"{name}@{version}"


def register_world(cls: type[World]) -> type[World]:
    """Class decorator: ``cls`` is world ``cls.name`` version ``cls.version``."""
    WORLDS.add(world_key(cls.name, cls.version), cls)
    return cls


def world_class(name: str, version: str) -> type[World]:
    """The registered world ``name`` at ``version``; BadInput naming the known ones if there is none."""
    return WORLDS.get(world_key(name, version), field="world")


def user_said(header: HeaderEntry, call: ToolCallView) -> str | None:
    """What an agent episode's simulated user said answering ``call``, read from the call's result as the world's
    :meth:`World.user_said` reads it; None for a call that did not speak to the user, an error result, or a world
    this code does not know (the report's and the Inspect export's conversation view)."""
    named, result = header.world, call.result
    if named is None or result is None or result.status != "ok":
        return None
    try:
        cls = world_class(named.name, named.world)
    except BadInput:
        return None
    return cls.user_said(result.content) if call.request.request.name in cls.user_tools else None


def make_world(task: WorldTask) -> World:
    """A fresh, not yet reset, world for ``task``."""
    return world_class(task.world, task.version)()


def score_final_state(final_state: Mapping[str, Any]) -> dict[str, float]:
    """Scores of a final state by its world's verifier; needs no world run (rescoring)."""
    world = final_state.get("world")
    if not isinstance(world, Mapping) or not isinstance(world.get("name"), str):
        raise BadInput("final_state.world", "expected {name, version} of the world that made it")
    verifier = world_class(world["name"], str(world.get("version"))).verifier
    with world_guard():  # the verifier is world code: it reads only the final state
        return verifier(final_state)


def set_scores(submitted: Iterable[Any] | None, truth: Iterable[Any]) -> dict[str, float]:
    """Precision, recall, F1 and pass of a submitted set against the true set.

    Nothing submitted (the episode ended without a report) passes nothing; an empty submission is
    perfect only when the truth is empty too. Pass is 1.0 exactly when the sets are equal.
    """
    true = set(truth)
    if submitted is None:
        return {"precision": 0.0, "recall": 0.0, "f1": 0.0, "pass": 0.0}
    got = set(submitted)
    hit = len(got & true)
    precision = hit / len(got) if got else (1.0 if not true else 0.0)
    recall = hit / len(true) if true else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "pass": 1.0 if got == true else 0.0}
