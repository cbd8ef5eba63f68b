"""A held repeat (`evalrun replay RUN --live SIDE`) is planned from the run's stored config with the overrides of how
it runs, as `check` takes them: `cluster=NAME` among them. Engine-free: planning loads no engine."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from evalrun.audit.held import plan_held
from evalrun.config import MODELS_DIR
from evalrun.errors import BadInput

GOLDEN = Path(__file__).resolve().parent / "golden" / "invoice-desk-model-v1"  # a model agent, scripted customer
MOVED = f"model.path={MODELS_DIR / 'tiny-invoice-agent'}"  # where the package keeps the run's model now


def test_a_held_repeat_takes_a_cluster_group_as_check_does(tmp_path: Path) -> None:
    run = shutil.copytree(GOLDEN, tmp_path / "run")
    (plan,) = plan_held(run, "user", 0, ["cluster=inline", MOVED])
    assert plan.config.cluster.name == "inline"
    assert plan.config.task.world is not None and plan.config.task.world.held.side == "agent"
    (plan,) = plan_held(run, "user", 0, ["cluster=local", MOVED])  # the golden run was made inline
    assert plan.config.cluster.name == "local" and plan.config.cluster.max_in_flight == 2  # local.yaml's settings
    with pytest.raises(BadInput, match=r"cluster=nowhere: expected cluster=NAME with NAME one of \['inline'"):
        plan_held(run, "user", 0, ["cluster=nowhere", MOVED])
