"""Files replaced whole: a reader, or the next run after a crash, sees the old content
or the new, never half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_file(path: Path, content: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(content)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
