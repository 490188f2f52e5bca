"""What tells two versions of the code apart: a hash of Python source files (pure, stdlib only)."""

from __future__ import annotations

from pathlib import Path


def hash_sources(digest, folder: Path, label: str) -> None:
    """Feed ``digest`` (a ``hashlib`` object) every ``.py`` file under ``folder``, sorted, each as
    ``<label>/<relative path>``, its bytes and separators (``__pycache__`` left out)."""
    for file in sorted(folder.rglob("*.py")):
        if "__pycache__" not in file.parts:
            digest.update(f"{label}/{file.relative_to(folder).as_posix()}\0".encode() + file.read_bytes() + b"\0")
