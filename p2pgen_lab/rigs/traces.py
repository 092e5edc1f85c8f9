"""Reading the JSON-lines traces a run left in a directory (applications' `$P2PGEN_TRACE_DIR/*.jsonl`, agents'
Raft traces under `raft/`). Owns nothing else; a line cut by SIGKILL, or one that is not a record with a
numeric time `t`, is skipped, never an error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_records(directory: Path) -> list[dict[str, Any]]:
    """Every record of the *.jsonl files directly under `directory` (not its subfolders), by time; [] when
    the directory does not exist."""
    records = []
    for path in sorted(directory.glob("*.jsonl")) if directory.is_dir() else ():
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("t"), (int, float)):
                records.append(record)
    return sorted(records, key=lambda r: r["t"])
