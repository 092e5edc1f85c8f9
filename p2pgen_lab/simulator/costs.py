"""Reconfiguration costs of p2pgen, as measured by `p2pgen bench recovery --json` or assumed.

Owns: reading that JSON and the stated default figures used until a measurement exists.
Invariant: every `RecoveryCosts` says where its numbers came from (`source`), and tables print it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Assumed until `p2pgen bench recovery` measures them (figures given by the agent's author):
# SIGKILL of an application -> next generation active in ~0.3 s (p50); an agent/host kill costs the
# detection timeout + the same 0.3 s (the simulator adds its own simulated detection); a join is assumed
# to stall the group for one generation change too.
DEFAULT_P50_S = 0.3
DEFAULT_P99_S = 0.6


@dataclass(frozen=True)
class RecoveryCosts:
    """Group stall per membership change after detection, in seconds."""

    evict_p50: float
    evict_p99: float
    join_p50: float
    join_p99: float
    source: str

    def quantile(self, q: str) -> tuple[float, float]:
        """(evict, join) stall for q in {'p50', 'p99'}."""
        if q not in ("p50", "p99"):
            raise ValueError(f"quantile must be 'p50' or 'p99', got {q!r}")
        return (self.evict_p50, self.join_p50) if q == "p50" else (self.evict_p99, self.join_p99)


def assumed_costs() -> RecoveryCosts:
    return RecoveryCosts(DEFAULT_P50_S, DEFAULT_P99_S, DEFAULT_P50_S, DEFAULT_P99_S,
                         source=f"assumed: app SIGKILL -> active {DEFAULT_P50_S} s p50 / {DEFAULT_P99_S} s p99, "
                                f"join stall the same (no `p2pgen bench recovery --json` given)")


def load_costs(path: str | Path | None) -> RecoveryCosts:
    """Costs from a `p2pgen bench recovery --json` file, or the assumed defaults when `path` is None.

    Eviction stall = `sigkill_app_to_active_s` (detection there is instant, so it is all reconfiguration).
    Join stall = `join_to_member_s`, an upper bound: it includes the joiner's own start-up.
    """
    if path is None:
        return assumed_costs()
    data = json.loads(Path(path).read_text())
    try:
        evict, join = data["sigkill_app_to_active_s"], data["join_to_member_s"]
        costs = RecoveryCosts(float(evict["p50"]), float(evict["p99"]), float(join["p50"]), float(join["p99"]),
                              source=f"measured: {path}")
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: expected sigkill_app_to_active_s and join_to_member_s with p50 and p99 "
                         f"(seconds), as written by `p2pgen bench recovery --json`: {err!r}") from None
    if min(costs.evict_p50, costs.evict_p99, costs.join_p50, costs.join_p99) < 0:
        raise ValueError(f"{path}: recovery times must be non-negative")
    return costs
