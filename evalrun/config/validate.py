"""Validation: a composed Hydra config to a checked, typed :class:`EvalConfig`, before any model loads."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from evalrun.config.jsonl import objects
from evalrun.config.settings import AUTO, EvalConfig, check_master_seed
from evalrun.errors import BadInput
from evalrun.records.seeds import generate_master_seed


def _resolve_path(value: str, field_name: str, *, must_be: str = "file") -> Path:
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    ok = path.is_file() if must_be == "file" else path.is_dir()
    if not ok:
        raise BadInput(field_name, f"{path} does not exist or is not a {must_be}")
    return path


def without_recorded_sources(cfg: DictConfig) -> None:
    """A run's composed config, less what a replay finds in the run itself: the model directories (every response is
    served from the record) and a held side's run (its replies are in the run's own chains)."""
    for section in ("model", "judge_model", "user_model"):
        if cfg.get(section) is not None:
            cfg[section].path = None
    world = cfg.task.get("world")
    if world is not None and world.get("held") is not None:
        world.held.side, world.held.run = None, None


def check_dataset(path: Path, id_field: str, target_field: str, choices_field: str | None = None) -> int:
    """Check a JSON Lines dataset line by line; returns the item count. Errors name file and line.

    With ``choices_field``, each item lists at least two distinct option strings there, and its
    target is the index of the right one.
    """
    seen: dict[str, str] = {}
    for where, item in objects(path):
        for key in (id_field, target_field):
            if key not in item:
                raise BadInput(where, f"missing field {key!r}")
        if choices_field is not None:
            _check_choices(item, where, choices_field, target_field)
        item_id = str(item[id_field])
        if item_id in seen:
            raise BadInput(where, f"duplicate item id {item_id!r} (first at {seen[item_id]})")
        seen[item_id] = where
    if not seen:
        raise BadInput(str(path), "the dataset has no items")
    return len(seen)


def _check_choices(item: dict[str, Any], where: str, choices_field: str, target_field: str) -> None:
    options = item.get(choices_field)
    if not isinstance(options, list) or len(options) < 2 or not all(isinstance(o, str) and o for o in options):
        raise BadInput(
            f"{where}: field {choices_field}", f"expected a list of at least two option strings, got {options!r}"
        )
    if len(set(options)) != len(options):
        raise BadInput(f"{where}: field {choices_field}", f"expected distinct options, got {options!r}")
    answer = item[target_field]
    if type(answer) is not int or not 0 <= answer < len(options):
        raise BadInput(f"{where}: field {target_field}",
                       f"expected the index of the right option (0 to {len(options) - 1}), got {answer!r}")  # fmt: skip


def _with_master_seed(raw: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``seeds.master=auto`` replaced by a generated master seed (and True: generated); any other
    master seed checked as given (docs/design.md "Seeds"). Each call generates anew: every job of a
    multirun gets its own."""
    seeds = raw.get("seeds")
    if not isinstance(seeds, dict) or "master" not in seeds:
        return raw, False  # from_record names what is missing
    if seeds["master"] != AUTO:
        check_master_seed(seeds["master"])
        return raw, False
    return {**raw, "seeds": {**seeds, "master": generate_master_seed()}}, True


def validate(cfg: DictConfig) -> EvalConfig:
    """Resolve, type, check values and files; raise :class:`BadInput` naming the first problem."""
    try:
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "config"
        raise BadInput(key, f"missing or unresolvable value ({exc.msg if hasattr(exc, 'msg') else exc})") from exc
    assert isinstance(raw, dict)
    raw, generated = _with_master_seed(raw)
    settings = EvalConfig.from_record(raw)
    if generated:
        settings = replace(settings, seeds=replace(settings.seeds, master_generated=True))
    settings.check()
    task = settings.task
    for name, model in (("model", settings.model), ("judge_model", settings.judge_model),
                        ("user_model", settings.user_model)):  # fmt: skip
        if model is not None and model.path:
            _resolve_path(str(Path(model.path)), f"{name}.path", must_be="dir")
    if task.chat_template is not None:
        chat_template_path = _resolve_path(task.chat_template, "task.chat_template")
        settings = replace(settings, chat_template_path=chat_template_path)
    if task.world is not None:  # an agent task: its world is checked where worlds are known (the plan)
        world = task.world
        if world.user_prompt is not None:
            settings = replace(settings, user_prompt_path=_resolve_path(world.user_prompt, "task.world.user_prompt"))
        if world.held.run is not None:
            held = _resolve_path(world.held.run, "task.world.held.run", must_be="dir")
            settings = replace(settings, held_run_path=held)
        return settings
    if task.path is not None:  # an lm-eval task YAML (or a directory of them): read by its kind, evalrun/tasks/lm_eval
        given = Path(task.path).expanduser()
        path = given if given.is_absolute() else Path.cwd() / given
        if not path.exists():
            raise BadInput("task.path", f"{path} does not exist (an lm-eval task YAML, or a directory of them)")
        return replace(settings, prompt_path=path)
    assert task.dataset is not None
    dataset_path = _resolve_path(task.dataset, "task.dataset")
    if task.prompt_pack is not None:
        prompt_path = _resolve_path(task.prompt_pack, "task.prompt_pack", must_be="dir")
    else:
        assert task.template is not None
        prompt_path = _resolve_path(task.template, "task.template")
    rubric_path = _resolve_path(task.rubric, "task.rubric") if task.rubric is not None else None
    check_dataset(dataset_path, task.id_field, task.target_field, task.choices.field)
    return replace(settings, dataset_path=dataset_path, prompt_path=prompt_path, rubric_path=rubric_path)
