"""Agent worlds: seeded offline environments an agent acts in through tool calls (issue 12).

- :mod:`evalrun.worlds.base`: the world interface, tool specs, effects, tasks, the world registry;
- :mod:`evalrun.worlds.guard`: the world guard around world code (no network, no read that bypasses the effects);
- :mod:`evalrun.worlds.actions`: the tool-call text format and the rendering of results;
- :mod:`evalrun.worlds.suite`: families, seed ranges and held-out split from config, as tasks;
- :mod:`evalrun.worlds.invoice_desk`: the ``invoice-desk`` world, versions 1 and 2;
- :mod:`evalrun.worlds.shift_planner`: the ``shift-planner`` world, scored against frozen references;
- :mod:`evalrun.worlds.support_desk`: the ``support-desk`` world, a conversation with a scripted customer;
- :mod:`evalrun.worlds.solver`: the CP-SAT model of a shift-planner instance (imports ortools lazily);
- :mod:`evalrun.worlds.reference_sets`: ``evalrun references build`` and ``check``;
- :mod:`evalrun.worlds.scripted`: the scripted reference agent and a driver;
- :mod:`evalrun.worlds.scripted_planner`: its policies for ``shift-planner`` (optimal, greedy);
- :mod:`evalrun.worlds.scripted_support`: its policy for ``support-desk``.

Worlds are engine-free and sit beside tasks in the layers: they import records, config's registry
mechanism and errors only.
"""

from __future__ import annotations

from evalrun.worlds.base import (
    WORLDS,
    Effects,
    SeededEffects,
    ToolError,
    ToolResult,
    ToolSpec,
    UserTurn,
    World,
    WorldTask,
    effects_for,
    make_world,
    register_world,
    score_final_state,
    tools_hash,
    user_said,
    world_class,
    world_key,
)
from evalrun.worlds.guard import NetworkUsed, RecorderBypassed, world_guard

for _version in ("1", "2"):
    WORLDS.declare(world_key("invoice-desk", _version), "evalrun.worlds.invoice_desk")
WORLDS.declare(world_key("shift-planner", "1"), "evalrun.worlds.shift_planner")
WORLDS.declare(world_key("support-desk", "1"), "evalrun.worlds.support_desk")

__all__ = [
    "WORLDS",
    "Effects",
    "NetworkUsed",
    "RecorderBypassed",
    "SeededEffects",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "UserTurn",
    "World",
    "WorldTask",
    "effects_for",
    "make_world",
    "register_world",
    "score_final_state",
    "tools_hash",
    "user_said",
    "world_class",
    "world_guard",
    "world_key",
]
