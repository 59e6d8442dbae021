"""Local files written whole or not at all: a reader never sees half a JSON document."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json_atomic(path: Path, data: dict, mode: int = 0o644) -> None:
    """Write ``data`` as JSON next to ``path``, then rename it into place (creating the folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.chmod(tmp, mode)
    os.replace(tmp, path)
