"""Reading users' files and writing our own, with the project's error and crash rules."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hetsched.errors import InputError


def read_text(path: str | Path, expected: str = "a text file",
              max_bytes: int | None = None) -> str:
    """Read a user's input file; every failure becomes one InputError line naming it.

    With ``max_bytes`` a larger file is refused before it is read (and a pipe or
    device is read no further than the limit).
    """
    p = Path(path)
    try:
        if max_bytes is not None:
            with p.open("rb") as f:
                data = f.read(max_bytes + 1)
            if len(data) > max_bytes:
                size = max(p.stat().st_size, len(data))
                raise InputError(str(p), f"file is {size / 2**20:.1f} MiB; the limit for "
                                 f"{expected} is {max_bytes / 2**20:g} MiB")
            return data.decode("utf-8")
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(str(p), "file not found") from None
    except IsADirectoryError:
        raise InputError(str(p), f"is a directory, expected {expected}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(str(p), f"cannot read: {e}") from None


def atomic_write(path: Path, text: str) -> None:
    """Write via a temp file and a rename, so a crash never leaves half a file.

    The file is created 0600 (mkstemp's mode): plans, scripts and state sit
    beside the state file and are the user's own.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
