"""`p2pgen show --watch`: a terminal view of a job that redraws on each generation change.

Owns: the watch loop (long-polls the agent's `wait` RPC, so a change is drawn as soon as the agent applies
it, and nothing is redrawn while nothing changes), the "last fault" line computed from the history, and
the way a redraw reaches the screen (clear and redraw on a terminal; blocks separated by a rule elsewhere).
Invariant kept: read-only; an unreachable agent is retried, and said so, never fatal.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, TextIO

from p2pgen.errors import P2PGenError

CLEAR_SCREEN = "\x1b[H\x1b[2J"
WAIT_S = 5.0


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-3]


def last_fault(history: list[dict[str, Any]]) -> str | None:
    """The latest activated generation with fewer members than the one before it, and when the job had
    as many members again (its recovery), from `history` entries."""
    activated = [h for h in history if h["outcome"] == "activated"]
    for idx in range(len(activated) - 1, 0, -1):
        entry, before = activated[idx], activated[idx - 1]
        if len(entry["members"]) >= len(before["members"]):
            continue
        text = f"last fault: generation {entry['generation']} at {_when(entry['at'])}: {entry['reason']}"
        back = next((h for h in activated[idx + 1:] if len(h["members"]) >= len(before["members"])), None)
        if back is None:
            return text + f"; {len(entry['members'])} of {len(before['members'])} members, not recovered yet"
        return text + (f"; recovered in {back['at'] - entry['at']:.1f} s (generation {back['generation']}, "
                       f"{len(back['members'])} members)")
    return None


def _key(shown: dict[str, Any]) -> tuple:
    state = shown["state"]
    active, pending = state["active"], state["pending"]
    return (active and active["generation"], pending and pending.get("generation"), shown["raft"]["leader"],
            shown["agent"].get("waiting"))


def watch(connect: Callable[[], AbstractContextManager[Any]], render: Callable[[dict[str, Any]], str],
          out: TextIO | None = None, stop: Callable[[], bool] = lambda: False) -> int:
    """Draw `render(show)` and the last fault, then again on each generation change, until Ctrl-C or `stop()`."""
    out = out if out is not None else sys.stdout
    terminal = out.isatty()
    after, drawn, unreachable = -1, None, False
    try:
        while not stop():
            try:
                with connect() as client:
                    shown = client.wait(after, WAIT_S)
                    key = _key(shown)
                    history = client.history() if key != drawn else None
            except (OSError, P2PGenError) as e:
                if not unreachable:
                    out.write(f"cannot reach the agent ({e}); retrying every second\n")
                    out.flush()
                    unreachable = True
                time.sleep(1.0)
                continue
            unreachable = False
            after = shown["raft"]["index"]
            if history is None:
                continue
            drawn = key
            fault = last_fault(history) or "last fault: none"
            block = f"{render(shown)}\n{fault}\nwatching; redrawn on each generation change (Ctrl-C stops)\n"
            out.write((CLEAR_SCREEN + block) if terminal else (block + "-" * 40 + "\n"))
            out.flush()
    except KeyboardInterrupt:
        pass
    return 0
