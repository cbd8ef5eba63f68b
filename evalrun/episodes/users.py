"""Simulated users of conversational worlds: who answers when the agent speaks to the world's user
(``task.world.user``; docs/design.md "Simulated users").

- ``scripted`` (and null): the world's own user, written as seeded code (support-desk's customer); its replies
  are the user tool's result, with no model call, as every world recorded before simulated users existed.
- ``model``: a model plays the user from the world's facts through a user prompt pack
  (:mod:`evalrun.tasks.user_pack`): the run's model, or ``user_model`` on ``user_engine``. Every turn is a model
  call with ``role: user`` in the episode's chain, made during the agent's tool call, so a replay serves it from
  the record; the live turns waiting in a worker's batch are generated in one engine call.

A side of a conversation may be held fixed (``task.world.held``): its recorded replies are served in order, one
per turn, whatever the other side said, so a repeat measures the other side's variation alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from evalrun.chat import ChatFormat
from evalrun.config import DecodingConfig
from evalrun.config.registry import Registry
from evalrun.config.settings import MODEL_USER
from evalrun.engines import Completion, Engine, GenerationRequest, SamplingSpec
from evalrun.engines.replay import recorded_completion
from evalrun.episodes.harness import generate_each
from evalrun.episodes.plan import sampling_spec
from evalrun.errors import BadInput, CheckFailed
from evalrun.records.merkle import merkle_root
from evalrun.records.seeds import derive_seed
from evalrun.records.view import ChainView
from evalrun.rundir.reader import iter_chains, load_record, open_run, part_pairs
from evalrun.tasks.user_pack import UserPack
from evalrun.worlds import UserTurn
from evalrun.worlds.tool_formats import plain_chat

USER_PURPOSE = "user"  # derive_seed(str(episode sampling seed), "user", turn): a simulated user's turn's seed


def user_seed(sampling_seed: int, turn: int) -> int:
    """The seed a model playing an episode's user samples its ``turn``-th reply with (0 first), derived from the
    episode's own sampling seed, so a chain shows it derives from the seed the manifest's master seed gives, and each
    turn draws afresh (one seed for every turn would draw alike from alike prompts)."""
    return derive_seed(str(sampling_seed), USER_PURPOSE, turn)


@dataclass(frozen=True)
class Held:
    """One side of an episode held fixed: the replies a finished run recorded for it, in order (``CompletionResponse``
    records), served one per turn instead of a model's; ``source`` names the run (for a refusal's message)."""

    side: str  # agent | user
    replies: tuple[Mapping[str, Any], ...]
    source: str

    def serve(self, turn: int) -> Completion | str:
        """The recorded reply of the side's ``turn``-th turn, or why there is none (the live side asked for more
        turns than the recording has)."""
        if turn < len(self.replies):
            return recorded_completion(dict(self.replies[turn]))
        return (f"the held {self.side} side has {len(self.replies)} recorded replies ({self.source}); the live side "
                f"asked for reply {turn + 1}")  # fmt: skip


@dataclass(frozen=True)
class UserSide:
    """How a model plays one episode's simulated user: the prompt pack, the chat format of the user's model (None:
    plain ``role:`` lines) and the sampling, whose seed is the episode's sampling seed: each turn samples with
    :func:`user_seed` of it."""

    pack: UserPack
    chat: ChatFormat | None
    sampling: SamplingSpec

    def sampling_of(self, turn: int) -> SamplingSpec:
        return replace(self.sampling, seed=user_seed(self.sampling.seed, turn))


@dataclass(frozen=True)
class UserSetup:
    """A task's simulated user played by a model, as loaded: its prompt pack, the chat format of the model playing it,
    its decoding (the pack's, under ``task.world.user_decoding``) and which model plays it (``"run"``: the run's own;
    else the user model's id, revision and file hashes, so that its pins are in the digest)."""

    pack: UserPack
    chat: ChatFormat | None
    decoding: DecodingConfig
    model: str | Mapping[str, Any]

    def side(self, sampling_seed: int) -> UserSide:
        """How the user of the episode whose sampling seed is ``sampling_seed`` is played."""
        return UserSide(self.pack, self.chat, sampling_spec(self.decoding, sampling_seed))

    def as_record(self) -> dict[str, Any]:
        """What the world's record holds of the user (the digest's prompt-pack part): everything that decides what
        the user model is shown and how it samples, and which model it is."""
        return {
            "name": MODEL_USER,
            "pack": self.pack.as_record(),
            "decoding": {k: v for k, v in self.decoding.as_record().items() if k != "name"},
            "chat": self.chat.as_record() if self.chat is not None else None,
            "model": self.model,
        }


def user_setup(pack: UserPack, chat: ChatFormat | None, overrides: Mapping[str, Any],
               model: str | Mapping[str, Any]) -> UserSetup:  # fmt: skip
    """The setup of a user played by a model: the pack's decoding under ``overrides`` (``task.world.user_decoding``),
    always with the chosen tokens' logprobs."""
    decoding = DecodingConfig.from_record({**DecodingConfig(name="user").as_record(), **pack.decoding, **overrides,
                                           "logprobs": True})  # fmt: skip
    return UserSetup(pack, chat, decoding, model)


@dataclass(frozen=True)
class HeldReplies:
    """The recorded replies of one side of every episode of a finished run (``task.world.held``), by (task, item,
    seed, repeat); ``source`` is the run's record (Merkle root, seal, digest) and ``name`` its directory's name."""

    side: str
    source: Mapping[str, str]
    name: str
    replies: Mapping[tuple[str, str, int, int], tuple[Mapping[str, Any], ...]]

    def of(self, task: str, item: str, seed: int, repeat: int) -> Held:
        """The held side of one planned episode; a BadInput when the held run has no such episode."""
        found = self.replies.get((task, item, seed, repeat))
        if found is None:
            raise BadInput("task.world.held.run", f"{self.name} has no episode of task {task}, item {item}, seed "
                                                  f"{seed}, repeat {repeat}: hold a run of the same plan")  # fmt: skip
        return Held(self.side, found, self.name)

    def as_record(self) -> dict[str, Any]:
        return {"side": self.side, **self.source}


def load_held(path: Path, side: str) -> HeldReplies:
    """The replies ``side`` (agent: the policy's generations; user: a model-played user's turns) recorded in the
    finished run at ``path``, episode by episode in call order. Its chains must be the sealed run's (their heads give
    record.json's Merkle root) and must hold replies of that side; a BadInput names what is wrong."""
    where = "task.world.held.run"
    try:
        run = open_run(path)
        record = load_record(run)
        heads: list[tuple[str, str]] = []
        replies: dict[tuple[str, str, int, int], tuple[Mapping[str, Any], ...]] = {}
        for log_rel, _out_rel in part_pairs(run, record):
            for chain in iter_chains(run.path / log_rel, log_rel):
                view = ChainView.of(chain.entries)
                calls = view.user_turns if side == "user" else view.generations
                h = view.header
                replies[(h.task, h.item, h.seed, h.repeat)] = tuple(e.response.as_record() for e in calls)
                heads.append((chain.episode, chain.head))
    except CheckFailed as exc:
        raise BadInput(where, f"{path}: not a finished run whose records hold together ({exc})") from exc
    if merkle_root(heads) != record.merkle_root:
        raise BadInput(where, f"{path}: its chains do not give record.json's Merkle root: verify it first")
    if not any(replies.values()):
        what = "a model-played user's (task.world.user=model)" if side == "user" else "a model agent's"
        raise BadInput(where, f"{path} recorded no {side} replies to hold: expected a run with {what} replies")
    source = {"merkle_root": record.merkle_root, "seal": record.seal or "", "digest": record.digest}
    return HeldReplies(side, source, path.name, replies)


@dataclass(frozen=True)
class UserRequest:
    """A simulated user's turn waiting for its model: which episode, its model call and user turn numbers, the
    agent's tool call that spoke to the user, how the user is played, and what the world gives it."""

    episode_id: str
    call: int  # the episode's model call number (shared with the agent's calls)
    turn: int  # the episode's user turns before this one
    tool: int  # the tool call that spoke to the user
    side: UserSide
    held: Held | None  # the user held fixed: its recorded replies
    user_turn: UserTurn

    def generation(self) -> GenerationRequest:
        """The request a model is sent: the pack's messages from the user's side, through its chat format."""
        messages = self.side.pack.messages(self.user_turn.facts, self.user_turn.messages)
        chat = self.side.chat
        prompt = chat.render(messages) if chat is not None else plain_chat(messages)
        return GenerationRequest(prompt, self.side.sampling_of(self.turn), self.episode_id, self.call,
                                 add_special_tokens=chat is None,
                                 conversation=chat.conversation(messages) if chat is not None else None)  # fmt: skip


@dataclass(frozen=True)
class UserReply:
    """A simulated user's reply: what the agent is shown and whether the user ended the conversation; the request
    and completion the chain records, or why the engine refused the request (the episode then fails)."""

    text: str
    ended: bool
    request: GenerationRequest
    completion: Completion | None
    refused: str | None = None


class Users(Protocol):
    def respond(self, requests: Sequence[UserRequest]) -> list[UserReply]:
        """One reply per request, in order; a model generates every live one in one engine call."""
        ...


UsersFactory = Callable[[Engine], Users | None]
"""How ``task.world.user=NAME`` is built in a worker from the engine the user runs on (the user model's, else the
run's); None: the world's own user answers in the world."""

USERS: Registry[UsersFactory] = Registry("simulated user", "task.world.user")


def user(name: str) -> Callable[[UsersFactory], UsersFactory]:
    """Register a simulated user: ``@user("NAME")`` on a function ``(engine) -> Users | None``."""
    return USERS.register(name)


@user("scripted")
def scripted_user(engine: Engine) -> Users | None:
    """The world's own user, seeded code answering inside the world's tool: nothing to ask outside it."""
    return None


class ModelUser:
    """``task.world.user=model``: each request's prompt rendered from its pack, the live ones generated in one call of
    ``engine``, the held ones served from their recording."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.engine_calls = 0

    def respond(self, requests: Sequence[UserRequest]) -> list[UserReply]:
        generations = [r.generation() for r in requests]
        live = [i for i, r in enumerate(requests) if r.held is None]
        outcomes: dict[int, Completion | str] = {}
        if live:
            self.engine_calls += 1
            outcomes.update(zip(live, generate_each(self.engine, [generations[i] for i in live]), strict=True))
        for i, r in enumerate(requests):
            if r.held is not None:
                outcomes[i] = r.held.serve(r.turn)
        replies = []
        for i, (r, g) in enumerate(zip(requests, generations, strict=True)):
            outcome = outcomes[i]
            if isinstance(outcome, Completion):
                text, ended = r.side.pack.read_reply(outcome.output)
                replies.append(UserReply(text, ended, g, outcome))
            else:
                replies.append(UserReply("", False, g, None, refused=outcome))
        return replies


@user(MODEL_USER)
def model_user(engine: Engine) -> Users | None:
    """A model plays the user: the run's, or ``user_model`` on ``user_engine``."""
    return ModelUser(engine)
