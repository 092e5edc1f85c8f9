"""`p2pgen bench torch-suite`: torch's own distributed test suite (p2pgen_lab.rigs.torch_suite) run against
gloo and against p2pgen, side by side: passed / failed / skipped per backend, and every test whose outcome
differs between them with the reason it gave.

Each backend runs in its own process (torch's test file fixes the backend when it is imported), one after
the other; per-test outcomes are read back from the JSON each run writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

STATUSES = ("passed", "failed", "skipped")


def run_backend(backend: str, world: int, names: Sequence[str], timeout_s: int, progress: bool) -> dict:
    """{test: {status, seconds, detail}} of one backend's run (a killed run reports what it finished)."""
    with tempfile.TemporaryDirectory(prefix="p2pgen-torch-suite-") as tmp:
        out = Path(tmp) / "results.json"
        env = dict(os.environ, BACKEND=backend, WORLD_SIZE=str(world),
                   DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(timeout_s), TORCH_CPP_LOG_LEVEL="ERROR",
                   PYTORCH_PRINT_REPRO_ON_FAILURE="0")
        cmd = [sys.executable, "-m", "p2pgen_lab.rigs.torch_suite", "--json", str(out), *names]
        if progress:
            cmd.append("--progress")
        started = time.monotonic()
        proc = subprocess.run(cmd, env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                              stderr=None if progress else subprocess.DEVNULL)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"the {backend} run exited with {proc.returncode} and no results; rerun with --progress")
        return {"seconds": round(time.monotonic() - started, 1), "tests": json.loads(out.read_text())}


def summary(results: dict[str, dict]) -> dict[str, dict]:
    """Per backend: counts of each status and the wall time."""
    return {backend: {**{s: sum(t["status"] == s for t in r["tests"].values()) for s in STATUSES},
                      "seconds": r["seconds"]} for backend, r in results.items()}


def differences(results: dict[str, dict], base: str = "gloo", other: str = "p2pgen") -> list[tuple[str, str, str, str]]:
    """(test, base status, other status, other's detail) for every test whose status differs."""
    a, b = results[base]["tests"], results[other]["tests"]
    rows = []
    for name in sorted(set(a) | set(b)):
        sa, sb = a.get(name, {}).get("status", "-"), b.get(name, {}).get("status", "-")
        if sa != sb:
            rows.append((name, sa, sb, b.get(name, {}).get("detail", "") or a.get(name, {}).get("detail", "")))
    return rows


def format_table(results: dict[str, dict], world: int) -> str:
    counts = summary(results)
    lines = [f"torch {_torch_version()} distributed_test.py (DistributedTest._DistTestBase), world {world}",
             f"{'backend':8s} {'tests':>5s} {'passed':>6s} {'failed':>6s} {'skipped':>7s} {'wall s':>7s}"]
    for backend, c in counts.items():
        total = sum(c[s] for s in STATUSES)
        lines.append(f"{backend:8s} {total:5d} {c['passed']:6d} {c['failed']:6d} {c['skipped']:7d} {c['seconds']:7.0f}")
    if "gloo" in results and "p2pgen" in results:
        diff = differences(results)
        lines.append(f"\n{len(diff)} test(s) whose outcome differs (gloo -> p2pgen):")
        lines += [f"  {name}: {sa} -> {sb}  {detail}" for name, sa, sb, detail in diff]
    return "\n".join(lines)


def _torch_version() -> str:
    import torch

    return torch.__version__
