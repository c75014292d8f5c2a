"""Code from outside mixlab, loaded by name: an import path ``package.module:Name`` or an installed entry point.

Mixers (``models.mixers``, group ``mixlab.mixers``) and tasks (``tasks``, group ``mixlab.tasks``) load this way;
each checks what it loaded against its own contract.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Iterable, Mapping
from typing import Any

_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def is_import_path(name: str) -> bool:
    """True for text of the form ``package.module:Name`` (a colon marks an import path, never a name)."""
    return ":" in name


def error_line(exc: BaseException) -> str:
    """``"ValueError: first line of the message"``."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def load_object(path: str, label: str, form: str) -> Any:
    """The object at ``package.module:Attr`` (Attr may be dotted); ValueError starting with ``label`` for a
    malformed path (``form`` says the expected one, e.g. ``package.module:Factory``), an import that fails (any
    exception of the module's own code) or a missing attribute."""
    if not _IMPORT_PATH.fullmatch(path):
        raise ValueError(f"{label}: {path!r} is not an import path of the form {form}")
    module_name, _, attr = path.partition(":")
    try:
        target = importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(f"{label}: cannot import {module_name!r}: {error_line(exc)}") from exc
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{label}: {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    return target


def entry_points(group: str) -> dict[str, list[importlib.metadata.EntryPoint]]:
    """Installed entry points of ``group`` by name (nothing is imported). A distribution seen twice on sys.path
    counts once."""
    found: dict[str, list[importlib.metadata.EntryPoint]] = {}
    for ep in importlib.metadata.entry_points(group=group):
        if all(other.value != ep.value for other in found.get(ep.name, [])):
            found.setdefault(ep.name, []).append(ep)
    return found


def entry_point_origin(ep: importlib.metadata.EntryPoint) -> str:
    """``"entry point of mixlab-maxpool 0.1.0 (mixlab_maxpool:GatedMaxPool)"``."""
    dist = f" of {ep.dist.name} {ep.dist.version}" if ep.dist is not None else ""
    return f"entry point{dist} ({ep.value})"


def origins(built_in: Iterable[str], found: Mapping[str, list[importlib.metadata.EntryPoint]],
            built_in_label: str) -> dict[str, str]:
    """Every name reachable in a registry and where it comes from: the built-ins (``built_in_label``), then the
    installed entry points ``found`` by name (``"entry point of DIST VERSION (module:Name)"``); a built-in name an
    entry point also claims keeps the built-in, and a name two packages claim is ambiguous. Nothing is imported."""
    named = dict.fromkeys(built_in, built_in_label)
    for name, eps in sorted(found.items()):
        where = ", ".join(entry_point_origin(ep) for ep in eps)
        if name in named:
            named[name] = f"{built_in_label} (ignored: {where})"
        elif len(eps) > 1:
            named[name] = f"ambiguous: {where}; use an import path"
        else:
            named[name] = where
    return named


def named_entry_point(kind: str, name: str, found: Mapping[str, list[importlib.metadata.EntryPoint]],
                      known: Iterable[str], form: str) -> tuple[importlib.metadata.EntryPoint, str]:
    """The one installed entry point ``name`` of a registry of ``kind`` ("mixer", "task") and its origin.
    ValueError, one line: no such name (listing ``known`` and the import path ``form``), or two packages
    registering it."""
    eps = found.get(name, [])
    if not eps:
        raise ValueError(f"unknown {kind} {name!r}; choose from {', '.join(known)} or give an import path {form}")
    if len(eps) > 1:
        raise ValueError(f"{kind} {name!r} is registered by several packages "
                         f"({', '.join(entry_point_origin(ep) for ep in eps)}); use an import path")
    return eps[0], entry_point_origin(eps[0])
