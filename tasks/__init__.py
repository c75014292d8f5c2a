"""Seeded task generators and the task registry ``TASKS``."""

from mixlab.tasks.base import IGNORE, ROLE_TAGS, Role, Task, TaskData
from mixlab.tasks.mad import MAD_TASKS
from mixlab.tasks.mqar import MQAR
from mixlab.tasks.mqar_varlen import MQARVarlen
from mixlab.tasks.packed import PACKED_TASKS

TASKS: dict[str, type[Task]] = {cls.name: cls for cls in [MQAR, MQARVarlen, *MAD_TASKS, *PACKED_TASKS]}


def get_task(name: str, **params) -> Task:
    """Build a task by registry name; an unknown name or a bad parameter raises ValueError naming it."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[name](**params)


__all__ = ["IGNORE", "ROLE_TAGS", "Role", "TASKS", "Task", "TaskData", "get_task"]
