"""Seeded task generators and the task registry ``TASKS``.

Wherever a task name is accepted (``mixlab run``, ``tasks show``, sweeps, ``compare``, ``check-task``),
``task_class`` also takes
- the name of an entry point of the group ``mixlab.tasks`` in an installed package, and
- an import path ``package.module:TaskClass``,
both naming a subclass of ``Task`` (``tasks.base``: a ``Params`` dataclass and ``_generate``); ``mixlab
check-task`` audits one against the contract every task keeps. A built-in name wins over an entry point of the same
name.
"""

from mixlab.core import plugins
from mixlab.tasks.base import IGNORE, ROLE_TAGS, Role, Task, TaskData
from mixlab.tasks.mad import MAD_TASKS
from mixlab.tasks.mqar import MQAR
from mixlab.tasks.mqar_varlen import MQARVarlen
from mixlab.tasks.packed import PACKED_TASKS

TASKS: dict[str, type[Task]] = {cls.name: cls for cls in [MQAR, MQARVarlen, *MAD_TASKS, *PACKED_TASKS]}

ENTRY_POINT_GROUP = "mixlab.tasks"
BUILT_IN = "built-in"


def entry_points() -> dict:
    """Installed entry points of the group ``mixlab.tasks`` by name (nothing is imported)."""
    return plugins.entry_points(ENTRY_POINT_GROUP)


def task_origins() -> dict[str, str]:
    """Every task reachable by name and where it comes from: the built-ins, then installed entry points
    (``"entry point of DIST VERSION (module:TaskClass)"``). Nothing is imported."""
    return plugins.origins(TASKS, entry_points(), BUILT_IN)


def task_class(name: str) -> type[Task]:
    """The Task class of a built-in name, an entry-point name or an import path ``package.module:TaskClass``.

    ValueError, one line naming the task: an unknown name, two packages registering one name, a malformed path, a
    module that fails to import, a missing attribute, or an object that is not a subclass of ``Task``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a task is a non-empty name or import path, got {name!r}")
    if name in TASKS:
        return TASKS[name]
    if plugins.is_import_path(name):
        return _checked(name, plugins.load_object(name, f"task {name!r}", "package.module:TaskClass"))
    ep, origin = plugins.named_entry_point("task", name, entry_points(), task_origins(), "package.module:TaskClass")
    return _checked(name, plugins.load_object(ep.value, f"task {name!r} ({origin})", "package.module:TaskClass"))


def _checked(name: str, target: object) -> type[Task]:
    if not (isinstance(target, type) and issubclass(target, Task)):
        raise ValueError(f"task {name!r}: {target!r} is not a subclass of mixlab.tasks.Task")
    return target


def get_task(name: str, **params) -> Task:
    """Build a task by name (``task_class``); an unknown name or a bad parameter raises ValueError naming it."""
    return task_class(name)(**params)


__all__ = ["IGNORE", "ROLE_TAGS", "Role", "TASKS", "Task", "TaskData", "get_task", "task_class", "task_origins"]
