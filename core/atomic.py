"""Output files and folders: atomic writes, and folders checked before any work is spent on what goes in them.

``atomic_file`` writes beside the target and renames: a reader (another sweep worker, the aggregator, a resumed
sweep) sees a whole file or none. Its files get the permissions a plain ``open`` would give (0o666 less the
umask), so records, manifests and checkpoints are as readable as the rest of a shared folder.
``writable_folder`` makes an output folder and proves that it takes files, so a bad ``--out`` fails before a run
trains, not when its record is written. A write that fails raises an OSError naming the target file.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[BinaryIO]:
    """A new binary file to write ``path``'s contents to; when the block ends without an error it is flushed,
    fsynced and renamed over ``path``, else removed. An OSError names ``path`` (not the temporary file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # mode 0o666 as open() asks: the umask (or the folder's default ACL) sets the permissions, where
        # tempfile.mkstemp's 0o600 would hide the file from the rest of a shared group
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename in (None, str(tmp)):
            raise OSError(exc.errno, exc.strerror, str(path)) from exc  # the subclass of the errno
        raise


def write_json_atomic(path: Path, record: Mapping[str, Any]) -> None:
    """``record`` as indented JSON with sorted keys at ``path``, atomically (``atomic_file``)."""
    with atomic_file(path) as f:
        f.write(json.dumps(record, indent=1, sort_keys=True).encode())


def writable_folder(path: str | Path) -> Path:
    """``path`` as a folder that takes new files: made (with its parents) if missing, then a file is created
    and removed there. ValueError naming the folder and the reason otherwise (a file, no permission, a
    read-only or full file system, a place where folders cannot be made)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"output folder {str(path)!r} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ValueError(f"cannot write to output folder {str(path)!r}: {exc.strerror or exc}") from exc
    return path
