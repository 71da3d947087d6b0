"""Follow-ups (specs/scheduler.md S8): pick at most one continuation and overlay it on the parent.

``on_success`` after exit 0, ``on_fail`` after anything else. The overlay's keys replace the
parent's action fields; unknown keys are ignored. The child inherits the parent's own
``on_success``/``on_fail`` unless the overlay sets them, so chains can continue — up to the cap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OVERLAY_KEYS = {
    "kind": "action_kind",
    "action_kind": "action_kind",
    "model": "action_model",
    "prompt": "action_prompt",
    "agent": "action_agent",
    "play": "action_play",
    "flow_yaml": "action_flow_yaml",
    "command": "action_command",
    "args": "action_command_args",
    "command_args": "action_command_args",
    "extra_args": "action_extra_args",
    "cwd": "action_cwd",
    "project": "action_project",
    "on_success": "on_success",
    "on_fail": "on_fail",
}


def pick_continuation(schedule: Mapping[str, Any], exit_code: int | None) -> dict[str, Any] | None:
    """The follow-up overlay for a run that ended with ``exit_code`` (``on_success`` for 0, else ``on_fail``), or
    None.
    """
    key = "on_success" if exit_code == 0 else "on_fail"
    overlay = schedule.get(key)
    return dict(overlay) if overlay else None


def overlay_schedule(schedule: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``schedule`` with the overlay's known keys applied: the follow-up's action."""
    child = dict(schedule)
    for key, value in overlay.items():
        column = OVERLAY_KEYS.get(key) or (key if key.startswith("action_") and key in schedule else None)
        if column is not None:
            child[column] = value
    return child


def child_context(context: Mapping[str, Any], parent_run_id: str, exit_code: int | None, status: str) -> dict[str, Any]:
    """The trigger context of a follow-up run: the parent's context plus its run id, exit code and status."""
    return {**context, "chain_from": parent_run_id, "parent_exit_code": exit_code, "parent_status": status}


def may_continue(depth: int, max_depth: int) -> bool:
    """A child at ``depth + 1`` is launched only while ``depth`` is below the cap (S8)."""
    return depth < max_depth
