"""Text rendering of one generated example: every token with its role, then every scored position."""

from __future__ import annotations

import dataclasses

from mixlab.tasks.base import IGNORE, ROLE_TAGS, Role, Task, TaskData

WIDTH = 100


def render_example(task: Task, data: TaskData, index: int = 0, *, header: str = "") -> str:
    """Render row ``index`` of ``data``: tokens as ``role:label`` wrapped in lines that start with their position,
    a new line at each document boundary, then one line per scored position with its target."""
    if not 0 <= index < len(data):
        raise ValueError(f"example index {index} out of range for {len(data)} examples")
    tokens = data.inputs[index].tolist()
    targets = data.targets[index].tolist()
    roles = data.roles[index].tolist()
    docs = data.doc_ids[index].tolist() if data.doc_ids is not None else None

    params = " ".join(f"{k}={v}" for k, v in dataclasses.asdict(task.params).items())
    lines = [f"{task.name}  {params}"]
    if header:
        lines.append(header)
    lines.append(f"length {len(tokens)}, vocab_size {data.vocab_size}; tokens shown as role:token, roles: "
                 + ", ".join(ROLE_TAGS[r] for r in Role))

    current: list[str] = []
    line_start = 0

    def flush() -> None:
        if current:
            lines.append(f"{line_start:5d}  " + " ".join(current))
            current.clear()

    for pos, (tok, role) in enumerate(zip(tokens, roles)):
        if docs is not None and (pos == 0 or docs[pos] != docs[pos - 1]):
            flush()
            length = docs.count(docs[pos])
            lines.append(f"--- document {docs[pos]} (length {length}) ---")
        cell = f"{ROLE_TAGS[Role(role)]}:{task.token_label(tok)}"
        width = sum(len(c) + 1 for c in current) + len(cell)
        if not current or width > WIDTH - 7:
            flush()
            line_start = pos
        current.append(cell)
    flush()

    scored = [pos for pos, tgt in enumerate(targets) if tgt != IGNORE]
    lines.append(f"scored positions: {len(scored)}")
    for pos in scored:
        doc = f"  doc {docs[pos]}" if docs is not None else ""
        lines.append(
            f"{pos:5d}{doc}  input {task.token_label(tokens[pos])} ({ROLE_TAGS[Role(roles[pos])]})"
            f" -> target {task.token_label(targets[pos])}"
        )
    return "\n".join(lines)
