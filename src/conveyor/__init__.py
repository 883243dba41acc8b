"""Conveyor: a fault-tolerant execution platform on PostgreSQL."""

from conveyor.actions.registry import ActionRegistry, action, subprocess_action

__all__ = ["ActionRegistry", "action", "subprocess_action"]
__version__ = "0.2.0"
