"""Agent episodes: an agent acting over many turns in a seeded offline world, every read recorded.

An agent episode's chain (docs/design.md "Agent episodes") is: a header naming the world (name,
versions, tools hash, the generated world's hash, family, world seed, start time, clock tick) and
the agent; then per turn the model call (``agent=model``), one ``tool`` entry per call of the
reply, each call's effects (``clock``, ``random``, ``uuid``, ``env``) and ``observation`` in call
order, and a ``join`` entry when the reply held several calls; an unparseable reply gets an error
``observation`` answering the model call; the end entry says why the episode stopped and hashes
its final state. Everything that could vary between two runs of the episode is in the chain, so
a replay serves it from there (:class:`ScheduleSource`, through the world kind's ``replay``) and never reads a
live clock or model.

Live episodes advance in lockstep: every episode waiting for the model is generated in one engine
call, so a worker with 256 live episodes makes one engine call per turn, not 256. A simulated user played by a
model (:mod:`evalrun.episodes.users`) answers within a turn's tool calls: each episode's step is a generator that
yields the user turns it waits for, and the turns waiting in every episode are one engine call too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Generator as AbcGenerator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar, Protocol, TypeVar

from evalrun.chat import ChatFormat
from evalrun.chat.reasoning import ReasoningParser
from evalrun.config import DecodingConfig, EvalConfig, SeedsConfig, TaskConfig
from evalrun.config.registry import Registry
from evalrun.config.settings import WorldConfig
from evalrun.engines import Completion, Engine, GenerationRequest, SamplingSpec
from evalrun.engines.replay import Divergence
from evalrun.episodes.harness import (
    completion_record,
    encode_generator,
    failed_call,
    generate_each,
    header_fields,
    split_reasoning,
)
from evalrun.episodes.plan import episode_id, sampling_spec
from evalrun.episodes.users import Held, HeldReplies, UserReply, UserRequest, Users, UserSetup, UserSide
from evalrun.records.canonical import Canonical, canonical_hash, sha256_hex
from evalrun.records.chain import ChainBuilder
from evalrun.records.entries import (
    ClockEntry,
    ClockReading,
    ClockRequest,
    EndEntry,
    Entry,
    EnvEntry,
    EnvRequest,
    EnvValue,
    FailedCallEntry,
    HeaderEntry,
    JoinEntry,
    ModelEntry,
    ObservationEntry,
    RandomDraw,
    RandomEntry,
    RandomRequest,
    ToolEntry,
    ToolRequest,
    UserEntry,
    UuidEntry,
    UuidRequest,
    UuidValue,
    WorldHeader,
    generation_request,
    parse_line,
    request_hash,
)
from evalrun.records.formats import Generator
from evalrun.records.seeds import derive_seed
from evalrun.worlds import (
    Effects,
    SeededEffects,
    ToolResult,
    World,
    WorldTask,
    effects_for,
    make_world,
    world_class,
    world_guard,
)
from evalrun.worlds.actions import ParseError, Step, ToolCall, format_calls, system_prompt
from evalrun.worlds.base import score_final_state
from evalrun.worlds.scripted import Policy, scripted_policy
from evalrun.worlds.suite import suite_from_mapping, world_tasks
from evalrun.worlds.tool_formats import JSON_TOOLS, ToolFormat


@dataclass(frozen=True)
class AgentBudget:
    """What ends a runaway episode: turns, and tokens the model generates over the whole episode."""

    max_steps: int = 12
    max_tokens: int = 4096


@dataclass(frozen=True)
class AgentEpisode:
    kind: ClassVar[str] = "world"  # the kind of episode that runs it (evalrun.episodes.EPISODE_KINDS)

    episode_id: str
    task: str  # the run's task name
    world_task: WorldTask
    seed: int  # the run's seed (of the seed set) this episode is under
    repeat: int
    sampling: SamplingSpec
    agent: str
    budget: AgentBudget
    chat: ChatFormat | None = None  # how a model agent's messages become its prompt; None: plain ``role:`` lines
    tools: ToolFormat = JSON_TOOLS  # how the tools are shown and the replies read
    reasoning: ReasoningParser | None = None  # splits each reply into thinking and answer (tools read the answer)
    user: UserSide | None = None  # how a model plays the world's simulated user (None: the world's own user)
    held: Held | None = None  # a side of the conversation served from a recorded run (task.world.held)

    @property
    def item_id(self) -> str:
        return self.world_task.item_id

    def held_side(self, side: str) -> Held | None:
        """The recorded replies of ``side`` (agent or user) when that side is held, else None."""
        return self.held if self.held is not None and self.held.side == side else None


def plan_agent_episodes(task_name: str, tasks: Sequence[WorldTask], decoding: DecodingConfig, seeds: SeedsConfig,
                        agent: str, budget: AgentBudget, chat: ChatFormat | None = None,
                        tools: ToolFormat = JSON_TOOLS, reasoning: ReasoningParser | None = None,
                        user: UserSetup | None = None,
                        held: HeldReplies | None = None) -> list[AgentEpisode]:  # fmt: skip
    """Episodes of every world task for every seed of the set and repeat, ids and sampling seeds
    derived as for single-turn episodes (docs/design.md "Seeds"): the same config gives the same
    episodes anywhere. The world is generated from the world task's own seed, so every seed and
    repeat of the set meets the same world and only the model's sampling differs. A user played by a model
    samples with seeds of its own (:func:`evalrun.episodes.users.user_seed`); a held side's recorded replies
    are the episode's of the same task, item, seed and repeat in the held run."""
    episodes = []
    for seed in seeds.set:
        for repeat in range(seeds.repeats):
            for task in tasks:
                sampling_seed = derive_seed(seeds.master, "sampling", task_name, task.item_id, seed, repeat)
                sampling = sampling_spec(decoding, sampling_seed)
                eid = episode_id(task_name, task.item_id, seed, repeat, {"sampling": str(sampling.seed)})
                side = user.side(sampling.seed) if user is not None else None
                recorded = held.of(task_name, task.item_id, seed, repeat) if held is not None else None
                episodes.append(AgentEpisode(eid, task_name, task, seed, repeat, sampling, agent, budget, chat, tools,
                                             reasoning, side, recorded))  # fmt: skip
    return episodes


@dataclass(frozen=True)
class AgentTask:
    """An agent task, loaded: the world suite's tasks and what decides how they are presented."""

    name: str
    config: WorldConfig
    tasks: tuple[WorldTask, ...]
    versions: dict[str, str]  # the world's name and versions, and its tools' hash
    system_prompt_sha256: str  # the tool list and reply format every model agent is shown
    chat: ChatFormat | None  # how a model agent's messages become prompts (agent=model), None: plain rendering
    references: dict[str, str] | None = None  # the frozen reference set the world scores against, if any
    tools: ToolFormat = JSON_TOOLS  # how a model agent is shown the tools and its replies are read
    reasoning: ReasoningParser | None = None  # splits a model agent's replies into thinking and answer
    user: UserSetup | None = None  # how a model plays the world's simulated user (None: the world's own user)
    held: HeldReplies | None = None  # a side served from a recorded run (task.world.held)

    @property
    def budget(self) -> AgentBudget:
        return AgentBudget(self.config.max_steps, self.config.max_tokens)

    def as_record(self) -> dict[str, Any]:
        """What the manifest's ``task.world`` and the prompt-pack digest part record of the task. The held run is
        named by its records (root, seal, digest), not its path; the user's settings by what they resolve to."""
        settings = self.config.as_record()
        settings.pop("held", None)
        for key in ("user", "user_prompt", "user_decoding"):
            settings.pop(key, None)
        return {
            **settings,
            # a user played by a model: its pack, decoding and model; only then, so the records of the others are
            # unchanged
            **({"user": self.user.as_record()} if self.user is not None else {}),
            **({"held": self.held.as_record()} if self.held is not None else {}),
            "items": len(self.tasks),
            "versions": self.versions,
            "system_prompt_sha256": self.system_prompt_sha256,
            "chat_template_sha256": sha256_hex(self.chat.template) if self.chat is not None else None,
            # a template file or template variables: only then, so the records of the others are unchanged
            **({"chat": self.chat.as_record()} if self.chat is not None and self.chat.customised else {}),
            # only for another format than json, so the records of the others are unchanged
            **({"tool_format": self.tools.as_record()} if self.tools.as_record() is not None else {}),
            # only for a reasoning model's replies, likewise
            **({"reasoning": self.reasoning.as_record()} if self.reasoning is not None else {}),
            # only for a world with references, so the records of the others are unchanged
            **({"references": self.references} if self.references is not None else {}),
        }


def agent_decoding(config: EvalConfig) -> EvalConfig:
    """``config`` with every model reply's token limit, ``task.world.reply_tokens``, as its decoding
    ``max_tokens`` (a reply is a JSON object of tool calls, not a 16-token answer), and the replies' own
    stop strings, ``task.world.stop``, when it is set: a reply ends at the model's end of turn, not at the
    decoding group's ``"\n"`` (null: the decoding group's, as runs recorded before the setting)."""
    world = config.task.world
    assert world is not None
    stop = {"stop": list(world.stop)} if world.stop is not None else {}
    return config.with_decoding({"max_tokens": world.reply_tokens, **stop})


def planned_world_tasks(world: WorldConfig, limit: int | None = None) -> list[WorldTask]:
    """The world tasks of ``task.world``'s suite (a BadInput names the field), the first ``limit``."""
    suite = suite_from_mapping({
        "name": world.name, "version": world.version, "family": list(world.family),
        "seeds": {"train": list(world.seeds.train), "test": list(world.seeds.test)}, "split": world.split,
        "start": world.start, "tick": world.tick,
    }, where="task.world")  # fmt: skip
    tasks = world_tasks(suite)
    return tasks[:limit] if limit is not None else tasks


def load_agent_task(task: TaskConfig, limit: int | None, chat: ChatFormat | None, tools: ToolFormat = JSON_TOOLS,
                    reasoning: ReasoningParser | None = None, user: UserSetup | None = None,
                    held: HeldReplies | None = None) -> AgentTask:  # fmt: skip
    """The suite of ``task.world`` (a BadInput names the field), its tasks (the first ``limit``), their
    frozen references checked (worlds with references), and for ``agent=model`` the chat format its
    prompts are rendered with; ``user`` and ``held`` as the world kind loaded them."""
    world = task.world
    assert world is not None
    tasks = planned_world_tasks(world, limit)
    cls = world_class(world.name, world.version)
    references = cls.check_references(tasks)  # a missing or mismatched reference: BadInput, before any model loads
    return AgentTask(
        name=task.name, config=world, tasks=tuple(tasks), versions=cls.versions(),
        system_prompt_sha256=sha256_hex(system_prompt(cls().tools())),
        chat=chat if world.agent == "model" else None, references=references, tools=tools,
        reasoning=reasoning if world.agent == "model" else None, user=user, held=held,
    )  # fmt: skip


# --- the recorder ------------------------------------------------------------------------------


class Recorder:
    """One episode's chain under construction, with each effect kind's calls numbered from 0."""

    def __init__(self, episode: str) -> None:
        self.chain = ChainBuilder(episode)
        self.calls: dict[str, int] = {}

    def next_call(self, kind: str) -> int:
        number = self.calls.get(kind, 0)
        self.calls[kind] = number + 1
        return number

    def append(self, entry_type: type[Entry], /, **fields: Any) -> None:
        self.chain.append(entry_type, **fields)

    def flush(self, reads: Sequence[Read], tool: int | None) -> None:
        """Append the effect entries of ``reads`` (one tool call's, in the order it made them)."""
        extra = {"tool": tool} if tool is not None else {}
        for read in reads:
            self.append(read.entry_type, call=self.next_call(read.kind), request=read.request,
                        response=read.response, **extra)  # fmt: skip


@dataclass(frozen=True)
class Read:
    """One effect read, before it takes its place in the chain."""

    kind: str
    entry_type: type[Entry]
    request: Any
    response: Any


class EffectSource(Protocol):
    """Where an effect's response comes from: the world's live effects, or a recorded schedule.
    ``tool`` and ``index`` say which read it is: the ``index``-th of its kind during tool call
    ``tool`` (None: outside any tool call)."""

    def serve(self, kind: str, tool: int | None, index: int, request: Any, live: Callable[[], Any]) -> Any: ...


class LiveSource:
    def serve(self, kind: str, tool: int | None, index: int, request: Any, live: Callable[[], Any]) -> Any:
        return live()


class RecordingEffects:
    """The :class:`~evalrun.worlds.Effects` one tool call (or the reset) reads through: each read is
    answered by ``source`` (live: ``inner``, the call's own seeded effects; replay: the schedule) and
    kept in ``reads``, which the recorder appends to the chain once the call is done, in call order,
    so that concurrent calls are recorded alike whatever order their threads ran in."""

    def __init__(self, inner: Effects, source: EffectSource, tool: int | None) -> None:
        self.inner, self.source, self.tool = inner, source, tool
        self.reads: list[Read] = []

    def _read(self, kind: str, entry_type: type[Entry], request: Any, live: Callable[[], Any]) -> Any:
        index = sum(r.kind == kind for r in self.reads)
        response = self.source.serve(kind, self.tool, index, request, live)
        self.reads.append(Read(kind, entry_type, request, response))
        return response

    def clock(self) -> float:
        reading = self._read("clock", ClockEntry, ClockRequest(clock="wall"),
                             lambda: ClockReading(seconds=self.inner.clock()))  # fmt: skip
        return float(reading.seconds)

    def random(self, purpose: str, bits: int) -> int:
        draw = self._read("random", RandomEntry, RandomRequest(purpose=purpose, bits=bits),
                          lambda: RandomDraw(value=str(self.inner.random(purpose, bits))))  # fmt: skip
        return int(draw.value)

    def uuid(self) -> str:
        value = self._read("uuid", UuidEntry, UuidRequest(version=4), lambda: UuidValue(uuid=self.inner.uuid()))
        return str(value.uuid)

    def env(self, name: str) -> str | None:
        value = self._read("env", EnvEntry, EnvRequest(name=name), lambda: EnvValue(value=self.inner.env(name)))
        return value.value


# --- agents ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """An episode waiting for its agent: what it has seen so far."""

    episode: AgentEpisode
    call: int  # the episode's next model call number
    task_text: str
    steps: tuple[Step, ...]
    tools: tuple[Any, ...]


@dataclass(frozen=True)
class Reply:
    text: str
    request: GenerationRequest | None = None  # a model's reply: the request and completion the chain records
    completion: Completion | None = None
    refused: str | None = None  # the engine refused the request: the episode fails with this reason


class Agent(Protocol):
    def act(self, turns: Sequence[Turn]) -> list[Reply]:
        """One reply per turn, in order; a model agent generates them all in one engine call."""
        ...


AgentFactory = Callable[[Engine], Agent]
"""How ``task.world.agent=NAME`` is built in a worker, from the worker's engine (a model agent renders with the
chat format each episode carries)."""

AGENTS: Registry[AgentFactory] = Registry("agent", "task.world.agent")


def agent(name: str) -> Callable[[AgentFactory], AgentFactory]:
    """Register an agent: ``@agent("NAME")`` on a function ``(engine) -> Agent``."""
    return AGENTS.register(name)


class ScriptedAgent:
    """``agent=scripted``: the world's deterministic reference policy (no model call); tests may pass
    another policy (e.g. the planner's greedy plan)."""

    def __init__(self, policy: Policy = scripted_policy) -> None:
        self.policy = policy

    def act(self, turns: Sequence[Turn]) -> list[Reply]:
        return [Reply(format_calls(self.policy(t.task_text, t.steps))) for t in turns]


@agent("scripted")
def scripted_agent(engine: Engine) -> Agent:
    return ScriptedAgent()


@agent("scripted_asking")
def scripted_asking_agent(engine: Engine) -> Agent:
    """The reference policy that asks the vendor's contact (invoice-desk's simulated person, whose reply draws
    from the world's random effect) about the first line it flags before reporting: one more turn."""
    return ScriptedAgent(partial(scripted_policy, ask_vendor=True))


class ModelAgent:
    """``agent=model``: the episode's prompt as its tool format renders it through its chat format (the model's
    chat template), generated by ``engine``: every waiting episode in one engine call."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.engine_calls = 0
        self.model_calls = 0

    def act(self, turns: Sequence[Turn]) -> list[Reply]:
        requests = []
        for t in turns:
            prompt, conversation = t.episode.tools.prompt(t.episode.chat, t.tools, t.task_text, t.steps)
            # every call samples with the episode's settings (verify checks them against the manifest);
            # the token budget is checked after each reply
            # a chat-formatted prompt has its special tokens from the template
            requests.append(GenerationRequest(prompt, t.episode.sampling, t.episode.episode_id, t.call,
                                              add_special_tokens=t.episode.chat is None,
                                              conversation=conversation))  # fmt: skip
        live = [i for i, t in enumerate(turns) if t.episode.held_side("agent") is None]
        outcomes: list[Completion | str] = [""] * len(turns)
        if live:
            self.engine_calls += 1
            self.model_calls += len(live)
            for i, outcome in zip(live, generate_each(self.engine, [requests[i] for i in live]), strict=True):
                outcomes[i] = outcome
        for i, t in enumerate(turns):
            held = t.episode.held_side("agent")
            if held is not None:  # the agent held fixed: its recorded reply of this turn, whatever it was shown
                outcomes[i] = held.serve(len(t.steps))
        replies = []
        for t, r, o in zip(turns, requests, outcomes, strict=True):
            if isinstance(o, Completion):
                o = split_reasoning(o, t.episode.reasoning)  # the tools are read from the answer, not the thinking
                replies.append(Reply(o.output, r, o))
            else:
                replies.append(Reply("", r, refused=o))
        return replies


@agent("model")
def model_agent(engine: Engine) -> Agent:
    """The run's model, prompted through the chat format each episode carries (its model's chat template)."""
    return ModelAgent(engine)


# --- episodes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentResult:
    episode: AgentEpisode
    log_lines: tuple[str, ...]
    head: str
    steps: tuple[Step, ...]
    final_state: dict[str, Any] | None  # None: the episode failed before its world had one
    scores: dict[str, float]
    model_calls: int
    tool_calls: int
    output_tokens: int
    stop: str | None  # done | max_steps | max_tokens; None when the episode failed
    error: str | None = None
    world_hash: str | None = None
    task_text: str = ""


T = TypeVar("T")
AsksUsers = AbcGenerator[UserRequest, UserReply, T]
"""A step of an episode that may wait for its simulated user: it yields each user turn a model must play and is
sent the reply (:func:`run_agent_episodes` batches the waiting turns of every episode)."""


@dataclass
class _Live:
    episode: AgentEpisode
    world: World
    recorder: Recorder
    seeded: SeededEffects  # the episode's live effects; each tool call reads through its own fork
    source: EffectSource
    task_text: str = ""
    steps: list[Step] = field(default_factory=list)
    model_calls: int = 0  # the agent's and a model-played user's, numbered together
    user_turns: int = 0
    tokens: int = 0  # the agent's
    stop: str | None = None
    error: str | None = None

    def turn(self) -> Turn:
        return Turn(self.episode, self.model_calls, self.task_text, tuple(self.steps), tuple(self.world.tools()))


def run_agent_episodes(episodes: Sequence[AgentEpisode], agent: Agent, generator: dict[str, Any] | Canonical,
                       sources: Callable[[AgentEpisode], EffectSource] | None = None,
                       users: Users | None = None) -> list[AgentResult]:  # fmt: skip
    """Run ``episodes`` to their end in lockstep; results in episode order.

    ``sources`` gives each episode's effect source (default: live); a replay passes the schedule.
    Every live episode waits for its agent at every turn (tools answer at once), so each turn is
    one :meth:`Agent.act` over all of them: one engine call for a model agent. A user played by a model
    (``users``, for episodes whose ``user`` says so) answers within a turn's tool calls: the turns waiting
    in every episode are one :meth:`Users.respond`, until no episode waits, then the agents act again.
    """
    typed_generator = Generator.model_validate_json(encode_generator(generator))
    live: list[_Live] = []
    finished: dict[str, _Live] = {}
    for e in episodes:
        state = _start(e, typed_generator, sources(e) if sources is not None else LiveSource())
        if state.error is None:
            live.append(state)
        else:
            finished[e.episode_id] = state
    while live:
        replies = agent.act([s.turn() for s in live])
        _step_all([_advance(state, reply) for state, reply in zip(live, replies, strict=True)], users)
        for state in [s for s in live if s.stop is not None or s.error is not None]:
            finished[state.episode.episode_id] = state
        live = [s for s in live if s.stop is None and s.error is None]
    return [_finish(finished[e.episode_id]) for e in episodes]


def _step_all(steps: list[AsksUsers[None]], users: Users | None) -> None:
    """Run every episode's step to its end, each user turn they wait for played in one batch per round."""
    waiting = [(step, request) for step in steps if (request := _next(step, None)) is not None]
    while waiting:
        if users is None:
            raise RuntimeError("an episode asks a simulated user played by a model, and the worker has none")
        replies = users.respond([request for _step, request in waiting])
        waiting = [(step, request) for (step, _), reply in zip(waiting, replies, strict=True)
                   if (request := _next(step, reply)) is not None]  # fmt: skip


def _next(step: AsksUsers[None], reply: UserReply | None) -> UserRequest | None:
    """The next user turn ``step`` waits for once sent ``reply`` (None: start it), or None when it has ended."""
    try:
        return step.send(reply) if reply is not None else next(step)
    except StopIteration:
        return None


def _start(episode: AgentEpisode, generator: Generator, source: EffectSource) -> _Live:
    task = episode.world_task
    world = make_world(task)
    recorder = Recorder(episode.episode_id)
    seeded = effects_for(task)
    state = _Live(episode, world, recorder, seeded, source)
    effects = RecordingEffects(seeded, source, None)
    header = header_fields(episode, generator)
    try:
        with world_guard():
            state.task_text = world.reset(task, effects)
    except Exception as exc:  # a fault of the world's code fails the episode, loudly, in its chain
        recorder.append(HeaderEntry, **header)
        state.error = f"world reset failed: {type(exc).__name__}: {exc}"
        return state
    versions = world.versions()
    header["world"] = WorldHeader(
        agent=episode.agent, family=task.family, name=task.world, start=task.start, task_text=state.task_text,
        tick=task.tick,
        tools=versions["tools"], tools_hash=versions["tools_hash"], verifier=versions["verifier"],
        world=versions["world"], world_hash=world.world_hash(), world_seed=task.seed,
    )  # fmt: skip
    recorder.append(HeaderEntry, **header)
    recorder.flush(effects.reads, None)  # what generating the world read, if anything
    return state


def _advance(state: _Live, reply: Reply) -> AsksUsers[None]:
    """Record one reply and everything it leads to; set ``stop`` or ``error`` when the episode ends."""
    recorder = state.recorder
    model_call = state.model_calls
    if reply.request is not None:
        state.model_calls += 1
        if reply.refused is not None:  # e.g. the history no longer fits the context
            failed_call(recorder.chain, model_call, reply.request, reply.refused)
            state.error = f"the engine refused model call {model_call}: {reply.refused}"
            return
        assert reply.completion is not None
        state.tokens += len(reply.completion.token_ids)
        recorder.append(ModelEntry, call=model_call, request=generation_request(reply.request.prompt,
                        reply.request.sampling), response=completion_record(reply.completion))  # fmt: skip
    parsed = state.episode.tools.parse(reply.text)
    if isinstance(parsed, ParseError) and state.world.reply_tool is not None and reply.text.strip():
        parsed = [ToolCall(state.world.reply_tool, {"message": reply.text.strip()})]  # a plain reply, said to the user
    if isinstance(parsed, ParseError):
        result = parsed.as_result()
        recorder.append(ObservationEntry, reply=model_call, status=result.status, content=result.content)
        state.steps.append(Step((), (result,), reply=reply.text))
    else:
        try:
            step = yield from _run_calls(state, parsed, reply.text)
        except Exception as exc:  # NetworkUsed, or a bug of the world: the episode fails, loudly
            state.error = f"{type(exc).__name__}: {exc}"
            return
        if step is None:  # a simulated user's turn failed the episode (state.error says why)
            return
        state.steps.append(step)
    budget = state.episode.budget
    if state.world.done:
        state.stop = "done"
    elif len(state.steps) >= budget.max_steps:
        state.stop = "max_steps"
    elif state.tokens >= budget.max_tokens:
        state.stop = "max_tokens"


def _run_calls(state: _Live, calls: list[ToolCall], text: str) -> AsksUsers[Step | None]:
    """The calls of one reply: tool entries, then each call's effects and observation in call order
    (the join order, never the order threads finish), then a join entry for parallel calls. Calls
    of tools the world lists as concurrent run at once, each on its own thread and effects. A call that speaks
    to a simulated user played by a model waits for the user's turn (yielded) between its two halves, its model
    call recorded between its effects and its observation; None when that turn failed the episode."""
    recorder, world = state.recorder, state.world
    numbers = []
    for call in calls:
        number = recorder.next_call("tool")
        recorder.append(ToolEntry, call=number, request=ToolRequest(name=call.name, arguments=dict(call.arguments)))
        numbers.append(number)

    def run(i: int) -> tuple[ToolResult, list[Read]]:
        effects = RecordingEffects(state.seeded.fork(numbers[i]), state.source, numbers[i])
        with world_guard():  # this thread's world code
            return world.call(calls[i].name, dict(calls[i].arguments), effects), effects.reads

    def record(number: int, result: ToolResult, reads: Sequence[Read]) -> None:
        recorder.flush(reads, number)
        recorder.append(ObservationEntry, call=number, status=result.status, content=result.content)

    results: list[ToolResult] = []
    if len(calls) > 1 and all(c.name in world.concurrent_tools for c in calls):
        with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="tool") as pool:
            outcomes = list(pool.map(run, range(len(calls))))
        for number, (result, reads) in zip(numbers, outcomes, strict=True):
            record(number, result, reads)
            results.append(result)
    else:
        for i, number in enumerate(numbers):
            if state.episode.user is not None and calls[i].name in world.user_tools:
                answered = yield from _ask_user(state, calls[i], number)
                if answered is None:
                    return None
                result, reads, entry = answered
                recorder.flush(reads, number)
                if entry is not None:
                    recorder.append(UserEntry, **entry)
                recorder.append(ObservationEntry, call=number, status=result.status, content=result.content)
            else:
                result, reads = run(i)
                record(number, result, reads)
            results.append(result)
    if len(calls) > 1:
        recorder.append(JoinEntry, calls=numbers)
    return Step(tuple(calls), tuple(results), reply=None if text == format_calls(calls) else text)


def _ask_user(state: _Live, call: ToolCall, number: int
              ) -> AsksUsers[tuple[ToolResult, list[Read], dict[str, Any] | None] | None]:  # fmt: skip
    """A call of a user tool when a model plays the user: the world takes the agent's message (or refuses the call:
    its error result, and no user turn), the user's turn is yielded, and the world takes the reply. The result, the
    call's reads and the fields of the user's model entry (None: the user was not asked); None when the engine
    refused the user's request (the episode fails with its failed model call, role user, as the chain's last entry
    before the end)."""
    world, side = state.world, state.episode.user
    assert side is not None
    effects = RecordingEffects(state.seeded.fork(number), state.source, number)
    with world_guard():
        asked = world.ask_user(call.name, dict(call.arguments), effects)
    if isinstance(asked, ToolResult):  # a bad call: the user is not asked
        return asked, effects.reads, None
    request = UserRequest(state.episode.episode_id, state.model_calls, state.user_turns, number, side,
                          state.episode.held_side("user"), asked)  # fmt: skip
    state.model_calls += 1
    state.user_turns += 1
    reply: UserReply = yield request
    if reply.refused is not None or reply.completion is None:
        state.recorder.flush(effects.reads, number)
        state.recorder.chain.append(FailedCallEntry, call=request.call, role="user", tool=number,
                                    request=generation_request(reply.request.prompt, reply.request.sampling),
                                    error=reply.refused or "no reply")  # fmt: skip
        state.error = f"the simulated user's model call {request.call} was refused: {reply.refused}"
        return None
    with world_guard():
        result = world.user_replied(reply.text, reply.ended, effects)
    entry = {"call": request.call, "tool": number, "response": completion_record(reply.completion),
             "request": generation_request(reply.request.prompt, reply.request.sampling)}  # fmt: skip
    return result, effects.reads, entry


def _finish(state: _Live) -> AgentResult:
    recorder = state.recorder
    final = None
    scores: dict[str, float] = {}
    world_hash = None
    if state.error is None:
        final = state.world.final_state()
        scores = score_final_state(final)
        world_hash = state.world.world_hash()
        recorder.append(EndEntry, model_calls=state.model_calls, status="ok", steps=len(state.steps),
                        stop=state.stop, final_state_sha256=canonical_hash(final))  # fmt: skip
    else:
        recorder.append(EndEntry, model_calls=state.model_calls, status="error", error=state.error,
                        steps=len(state.steps))  # fmt: skip
    return AgentResult(
        state.episode, tuple(recorder.chain.lines), recorder.chain.head, tuple(state.steps), final, scores,
        state.model_calls, recorder.calls.get("tool", 0), state.tokens, state.stop, state.error, world_hash,
        state.task_text,
    )  # fmt: skip


# --- replay ------------------------------------------------------------------------------------


class ScheduleSource:
    """Effects served from one episode's recorded chain: the ``index``-th read of a kind during tool
    call ``tool`` is the ``index``-th such entry, checked to have the same request; a read the record
    does not have is a divergence, never a live read."""

    def __init__(self, episode: str, lines: Sequence[str]) -> None:
        self.episode = episode
        self.recorded: dict[tuple[str, int | None, int], Any] = {}
        counts: dict[tuple[str, int | None], int] = {}
        for line in lines:
            entry = parse_line(line)
            if isinstance(entry, ClockEntry | RandomEntry | UuidEntry | EnvEntry):
                key = (entry.kind, entry.tool)
                self.recorded[(*key, counts.get(key, 0))] = entry
                counts[key] = counts.get(key, 0) + 1

    def serve(self, kind: str, tool: int | None, index: int, request: Any, live: Callable[[], Any]) -> Any:
        entry = self.recorded.get((kind, tool, index))
        where = f"{kind} read {index}" + (f" of tool call {tool}" if tool is not None else "")
        if entry is None:
            raise Divergence(self.episode, None, f"no {where} recorded", f"a {kind} read")
        if entry.request_hash != request_hash(request):
            raise Divergence(self.episode, entry.seq, f"{where}: {entry.request.as_record()}",
                             f"{request.as_record()}")  # fmt: skip
        return entry.response
