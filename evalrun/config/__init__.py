"""Structured configuration: typed settings, Hydra composition, one override parser, checks before any model loads.

- :mod:`evalrun.config.settings`: the typed, frozen settings (the one definition of each setting);
- :mod:`evalrun.config.schema`: Hydra's mutable schema, generated from them;
- :mod:`evalrun.config.overrides`: ``KEY=VALUE`` parsing, for every command;
- :mod:`evalrun.config.compose`: composition from overrides or from a run's config.yaml;
- :mod:`evalrun.config.validate`: values and files checked, the typed :class:`EvalConfig` made;
- :mod:`evalrun.config.registry`: the registry mechanism of the plug-in packages.
"""

from __future__ import annotations

from evalrun.config.compose import compose_config, expand_multirun, load, load_stored, to_yaml
from evalrun.config.overrides import Override, apply_overrides, parse_overrides
from evalrun.config.paths import BUILTIN_TASKS, CONF_DIR, MODELS_DIR, PACKAGE_DIR, REFERENCES_DIR
from evalrun.config.settings import (
    CPU_ISA_LEVELS,
    TRUNCATE_LEFT,
    ChoicesConfig,
    ClusterConfig,
    DecodingConfig,
    DeterminismConfig,
    EngineConfig,
    EvalConfig,
    ModelConfig,
    RunConfig,
    ScorerConfig,
    Section,
    SeedsConfig,
    TaskConfig,
)
from evalrun.config.validate import check_dataset, validate, without_recorded_sources

__all__ = [
    "BUILTIN_TASKS",
    "CONF_DIR",
    "CPU_ISA_LEVELS",
    "MODELS_DIR",
    "PACKAGE_DIR",
    "REFERENCES_DIR",
    "TRUNCATE_LEFT",
    "ChoicesConfig",
    "ClusterConfig",
    "DecodingConfig",
    "DeterminismConfig",
    "EngineConfig",
    "EvalConfig",
    "ModelConfig",
    "Override",
    "RunConfig",
    "ScorerConfig",
    "Section",
    "SeedsConfig",
    "TaskConfig",
    "apply_overrides",
    "check_dataset",
    "compose_config",
    "expand_multirun",
    "load",
    "load_stored",
    "parse_overrides",
    "to_yaml",
    "validate",
    "without_recorded_sources",
]
