"""The ``world`` kind: an agent acting over many turns in a seeded offline world, every read recorded
(docs/design.md "Agent episodes"). The recorder, the lockstep loop and the agents are
:mod:`evalrun.episodes.agent`; this module is the kind's side of the contract."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from evalrun.chat import chat_format
from evalrun.chat.reasoning import reasoning_parser
from evalrun.config import EvalConfig
from evalrun.config.settings import MODEL_USER
from evalrun.engines.pins import ResolvedModel
from evalrun.episodes import EncodedPart, Engines, FreezeOptions, ModelFiles, Provenance, episode_kind
from evalrun.episodes.agent import (
    AGENTS,
    Agent,
    AgentEpisode,
    AgentResult,
    AgentTask,
    ScheduleSource,
    agent_decoding,
    load_agent_task,
    plan_agent_episodes,
    planned_world_tasks,
    run_agent_episodes,
)
from evalrun.episodes.encode import agent_output_rows, encode_agent_part
from evalrun.episodes.recorded import as_dict, section, without
from evalrun.episodes.users import USERS, Users, UserSetup, load_held, user_setup
from evalrun.errors import BadInput
from evalrun.records.canonical import Canonical, sha256_hex
from evalrun.records.outputs import FAILED_FINISH_REASON, first_mismatch
from evalrun.records.view import ChainView
from evalrun.scoring import ScoringContext
from evalrun.scoring.context import verifier_identity
from evalrun.scoring.parts import PartScorer
from evalrun.tasks.rubric import Rubric
from evalrun.tasks.user_pack import load_user_pack
from evalrun.worlds import world_class
from evalrun.worlds.reference_sets import BuildReport, build_references
from evalrun.worlds.solver import SolverSettings
from evalrun.worlds.tool_formats import JSON_TOOLS, resolve_tool_format

NO_CONTEXT = ScoringContext().as_record()


def agent_prompt_record(world: dict[str, Any], decoding: dict[str, Any]) -> dict[str, Any]:
    """What ``digest.prompt_pack`` hashes for an agent task: the world task's record (world, versions
    and tools hash, families and seeds, agent and budgets, system prompt and chat template hashes)
    and the decoding settings: everything that decides what the agent is shown and how it answers."""
    return {"world": world, "decoding": decoding}


@dataclass(frozen=True)
class FrozenReferences:
    """The references of a world's tasks, as ``evalrun references build`` froze them."""

    report: BuildReport

    def as_json(self) -> dict[str, Any]:
        return self.report.as_json()

    def message(self) -> str:
        statuses = list(self.report.statuses.values())
        counts = ", ".join(f"{s} {statuses.count(s)}" for s in sorted(set(statuses)))
        index = self.report.index
        return f"built {len(statuses)} references ({counts}) in {index.directory}; index sha256 {index.sha256}"


def _agent(engines: Engines, name: str) -> Agent:
    """The worker's agent of ``task.world.agent``, built once per worker."""
    return engines.once(f"agent:{name}", lambda: AGENTS.get(name)(engines.engine))


def _users(engines: Engines, episodes: Sequence[AgentEpisode]) -> Users | None:
    """The worker's simulated users of ``task.world.user``, built once per worker on the user's engine (None: the
    world's own users answer in the world)."""
    if not episodes or episodes[0].user is None:
        return None
    return engines.once(f"user:{MODEL_USER}", lambda: USERS.get(MODEL_USER)(engines.users))


def _user_setup(config: EvalConfig, model: ModelFiles) -> UserSetup | None:
    """How a model plays the world's simulated user (``task.world.user=model``): the world's own prompt pack or
    ``task.world.user_prompt``'s, the chat format of the model playing it (the user model's, else the run's), and
    which model that is; None for the world's own user. A world without a user a model can play is a BadInput."""
    world = config.task.world
    assert world is not None
    USERS.check(world.user or "scripted")
    if not world.model_user:
        return None
    cls = world_class(world.name, world.version)
    if not cls.user_tools or cls.user_pack is None:
        raise BadInput("task.world.user", f"model: {world.name} has no simulated user a model can play")
    pack = load_user_pack(config.user_prompt_path or cls.user_pack)
    files = model.user or model
    if files.chat is None and files.directory is None:
        raise BadInput("user_model.path" if model.user is not None else "model.path",
                       f"the model playing the simulated user renders its prompts with its chat template: its "
                       f"directory ({files.where}) is not here and the run recorded no chat template")  # fmt: skip
    chat = chat_format(None, files.chat, None, None, files.where)
    played_by = dict(model.user.pins) if model.user is not None and model.user.pins is not None else "run"
    return user_setup(pack, chat, world.user_decoding.as_record(), played_by)


@episode_kind("world")
class WorldKind:
    name = "world"
    transcribed = True

    # --- config -> plan ---

    def load(self, config: EvalConfig, model: ModelFiles) -> tuple[EvalConfig, AgentTask]:
        world = config.task.world
        if world is None:
            raise BadInput("task.world", "missing: a world task names its world (task.world)")
        AGENTS.check(world.agent)
        config = agent_decoding(config)
        if world.agent == "model" and model.chat is None and model.directory is None:
            raise BadInput("model.path", "a model agent renders its prompts with the model's chat template: the "
                                         f"model's directory ({model.where}) is not here and the run recorded no "
                                         "chat template")  # fmt: skip
        chat = chat_format(config.task.chat_format, model.chat, config.chat_template_path,
                           config.task.chat_template_kwargs, model.where)  # fmt: skip
        tools, reasoning = JSON_TOOLS, None  # a scripted agent writes the JSON protocol, and does not think
        if world.agent == "model":
            tools = resolve_tool_format(world.tool_format, world.tool_parser, chat, model.directory, model.where)
            reasoning = reasoning_parser(config.task.reasoning_parser, model.directory, model.where,
                                         config.task.chat_template_kwargs)  # fmt: skip
        user = _user_setup(config, model)
        held = load_held(config.held_run_path, world.held.side) if config.held_run_path and world.held.side else None
        return config, load_agent_task(config.task, config.limit, chat, tools, reasoning, user, held)

    def plan(self, config: EvalConfig, task: AgentTask, model: ModelFiles) -> Sequence[AgentEpisode]:
        assert config.task.world is not None
        return plan_agent_episodes(task.name, task.tasks, config.decoding, config.seeds, config.task.world.agent,
                                   task.budget, task.chat, task.tools, task.reasoning, task.user,
                                   task.held)  # fmt: skip

    def scoring_context(self, config: EvalConfig, task: AgentTask, model: ResolvedModel,
                        judge_model: ResolvedModel | None) -> ScoringContext:  # fmt: skip
        return ScoringContext(verifier=verifier_identity(task.versions, task.references))

    def prompt_record(self, config: EvalConfig, task: AgentTask) -> dict[str, Any]:
        settings = {k: v for k, v in config.decoding.as_record().items() if k != "name"}
        return agent_prompt_record(task.as_record(), settings)

    def identity(self, config: EvalConfig, task: AgentTask) -> dict[str, Any]:
        return {"name": task.name, "world": task.as_record(), "scorer": config.task.scorer.as_record()}

    def section(self, config: EvalConfig, task: AgentTask) -> dict[str, Any]:
        return self.identity(config, task)

    def recorded_identity(self, identity: dict[str, Any], config: EvalConfig) -> dict[str, Any]:
        return identity

    def recorded_task_identity(self, task: Mapping[str, Any]) -> dict[str, Any]:
        return dict(task)  # the section is the identity (:meth:`section`)

    # --- dispatch ---

    def run(self, engines: Engines, episodes: list[AgentEpisode], generator: dict[str, Any] | Canonical) -> list[Any]:
        if not episodes:
            return []
        return run_agent_episodes(episodes, _agent(engines, episodes[0].agent), generator,
                                  users=_users(engines, episodes))  # fmt: skip

    def run_batches(self, engines: Engines, batches: Iterable[list[AgentEpisode]],
                    generator: dict[str, Any] | Canonical) -> Iterator[list[Any]]:  # fmt: skip
        for batch in batches:
            yield self.run(engines, batch, generator)

    def encode(self, results: list[AgentResult], provenance: Provenance,
               scorer: PartScorer | None = None) -> EncodedPart:  # fmt: skip
        return encode_agent_part(results, provenance, scorer)

    def output_rows(self, results: list[AgentResult], provenance: Provenance) -> pa.Table:
        return agent_output_rows(results, provenance)

    # --- replay and audit ---

    def replay(self, engines: Engines, episode: AgentEpisode, recorded: Sequence[str],
               generator: dict[str, Any] | Canonical) -> AgentResult:  # fmt: skip
        """The world rebuilt from its seed, the model's replies (a replay engine) and every effect served from
        the chain."""
        schedule = ScheduleSource(episode.episode_id, recorded)
        (result,) = run_agent_episodes([episode], _agent(engines, episode.agent), generator, lambda _e: schedule,
                                       _users(engines, [episode]))  # fmt: skip
        return result

    def rubric(self, task: AgentTask) -> Rubric | None:
        return None  # a world's verifier scores; no judge

    def recorded_scoring_context(self, manifest: Mapping[str, Any], rubric: Rubric | None) -> ScoringContext:
        return ScoringContext.recorded(dict(manifest), None)

    def recorded_scoring_record(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        world = as_dict(section(manifest, "task").get("world"))
        return {**NO_CONTEXT, "verifier": verifier_identity(as_dict(world.get("versions")), world.get("references"))}

    def recorded_prompt_record(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        decoding = without(section(manifest, "decoding"), "name")
        return agent_prompt_record(section(manifest, "task.world"), decoding)

    def prompt_source(self, key: str) -> str:
        return "task.world and decoding"

    def row_mismatch(self, row: dict[str, Any], chain: ChainView) -> str | None:
        """An agent episode's row against its chain (see :func:`evalrun.episodes.encode.agent_output_rows`)."""
        header, end = chain.header, chain.end
        if end is None:
            return "finish_reason"
        text = header.world.task_text if header.world is not None else ""
        tokens = sum(len(e.response.token_ids) for e in chain.generations)
        expected: dict[str, Any] = {
            "task": header.task, "item_id": header.item, "seed": header.seed, "repeat": header.repeat,
            "prompt": text, "prompt_sha256": sha256_hex(text), "output": "", "token_ids": [], "token_logprobs": [],
            "finish_reason": end.stop if end.status == "ok" and end.stop is not None else FAILED_FINISH_REASON,
            "output_tokens": tokens, "fewshot_ids": [], "shuffle_order": [], "option_logprobs": None,
            "option_greedy": None, "replies": None, "judgements": [],
        }  # fmt: skip
        if (column := first_mismatch(row, expected)) is not None:
            return column
        final = row["final_state"]
        if (None if final is None else sha256_hex(final)) != end.final_state_sha256:
            return "final_state"
        if row["seeds"] is None or str(row["seeds"]["sampling"]) != header.seeds.sampling:
            return "seeds"
        return None

    def freeze(self, config: EvalConfig, root: Path | None, options: FreezeOptions) -> FrozenReferences:
        world = config.task.world
        assert world is not None
        settings = SolverSettings(max_deterministic_time=options.max_deterministic_time,
                                  random_seed=options.random_seed)  # fmt: skip
        return FrozenReferences(build_references(planned_world_tasks(world), settings, options.allow_feasible, root))
