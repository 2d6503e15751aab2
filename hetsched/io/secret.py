"""A pool job's secret: random bytes in a 0600 file of the submission's private folder.

``hetsched submit`` writes it (:func:`write_secret`) before ``sbatch``; every
executor of the job reads it (:func:`read_secret`) and proves it knows it to
the coordinator (and the coordinator to it) without sending it. Nothing Slurm
shows (job id, plan id, node, port) tells anyone the secret.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from hetsched.errors import InputError, UnsafeFileError
from hetsched.io.files import atomic_write_with, check_private

#: bytes of a secret (HMAC-SHA256's block-size-independent key strength)
SECRET_BYTES = 32


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def write_secret(path: str | Path) -> bytes:
    """A fresh secret written to ``path`` (0600, in a 0700 folder it creates); returns it."""
    key = new_secret()
    atomic_write_with(Path(path), lambda f: f.write(key.hex().encode() + b"\n"), durable=True)
    return key


def read_secret(path: str | Path) -> bytes:
    """The secret in ``path``; one line (InputError / UnsafeFileError) when it is missing,
    malformed, or readable or writable by anyone but its owner."""
    p = Path(path)
    check_private(p, "pool job key file")
    try:
        st = os.stat(p)
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UnsafeFileError(str(p), f"refused as a pool job key file: mode "
                                  f"{stat.S_IMODE(st.st_mode):04o} lets others read it "
                                  "(it must be 0600); submit again for a new one")
        with open(p, "rb") as f:
            raw = f.read(4 * SECRET_BYTES)
    except FileNotFoundError:
        raise InputError(str(p), "pool job key file not found (hetsched submit writes it "
                         "beside the plan copy; --local makes its own)") from None
    except OSError as e:
        raise InputError(str(p), f"cannot read the pool job key file: {e.strerror}") from None
    try:
        key = bytes.fromhex(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != SECRET_BYTES:
        raise InputError(str(p), f"not a pool job key file ({SECRET_BYTES} bytes as hex)")
    return key
