"""`p2pgen recover`: a fenced re-form of a job whose Raft majority is gone for good.

Owns: asking every agent it can reach (the ones given, and every agent they know) what they see, the pure
decision `p2pgen.core.recovery.plan_recovery`, and carrying it out: the seed starts a new Raft epoch from its
own state (its first entry, `Reformed`, evicts the lost agents' members and proposes the survivors), then every
other survivor joins that epoch. The frontier is then elected from the survivors' `ready` votes as usual.
Invariant kept: nothing is changed unless the plan says so; a refusal says why and changes nothing.
"""

from __future__ import annotations

import time
from typing import Any

from p2pgen.agent.rpc import RpcClient
from p2pgen.core.recovery import RecoveryPlan, Survivor, plan_recovery
from p2pgen.errors import P2PGenError


def survivor_of(addr: str, shown: dict[str, Any]) -> Survivor:
    raft = shown["raft"]
    return Survivor(addr, int(raft.get("epoch", 0)), raft.get("self") or "", tuple(raft["nodes"]),
                    raft.get("leader") or "", tuple(raft.get("applied", (0, raft["index"]))))


class Recovery:
    def __init__(self, peers: list[str], gone: list[str], secret: bytes, job: str | None, timeout: float) -> None:
        self.peers, self.gone, self.secret, self.job, self.timeout = peers, frozenset(gone), secret, job, timeout

    def _call(self, addr: str, method: str, **params: Any) -> Any:
        with RpcClient(addr, self.secret, timeout=3.0, expect_job=self.job) as client:
            return client.call(method, **params)

    def survey(self) -> tuple[tuple[Survivor, ...], list[str]]:
        """Every agent that answers `show`, found from the given ones; and the ones that did not answer."""
        to_ask, asked, found, silent = list(self.peers) + sorted(self.gone), set(), [], []
        while to_ask:
            addr = to_ask.pop(0)
            if addr in asked:
                continue
            asked.add(addr)
            try:
                shown = self._call(addr, "show")
            except (OSError, P2PGenError):
                silent.append(addr)
                continue
            found.append(survivor_of(addr, shown))
            known = [v["agent"] for v in shown["raft"].get("voters", [])]
            known += [m["addrs"].get("agent") for m in shown["state"]["members"] if m["addrs"].get("agent")]
            to_ask += [a for a in known if a not in asked]
        return tuple(found), silent

    def run(self, say) -> RecoveryPlan:
        survivors, silent = self.survey()
        say(f"asked {len(survivors) + len(silent)} agent(s): {len(survivors)} answered"
            + (f", silent: {', '.join(silent)}" if silent else ""))
        plan = plan_recovery(survivors, self.gone)
        if not plan.ok:
            return plan
        say(plan.reason)
        self._call(plan.seed, "reform", epoch=plan.epoch, seed=plan.seed, gone=sorted(self.gone))
        self._wait_in_epoch(plan.seed, plan.epoch, say)
        for addr in plan.followers:
            try:
                self._call(addr, "reform", epoch=plan.epoch, seed=plan.seed, gone=sorted(self.gone))
            except (OSError, P2PGenError) as e:
                say(f"{addr} did not take the re-form ({e}); it will find epoch {plan.epoch} when it rejoins")
        for addr in plan.followers:
            self._wait_in_epoch(addr, plan.epoch, say)
        return plan

    def _wait_in_epoch(self, addr: str, epoch: int, say) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:
                raft = self._call(addr, "show")["raft"]
                if raft.get("epoch") == epoch and raft.get("leader"):
                    say(f"{addr} is in Raft epoch {epoch} ({'voter' if raft.get('voter') else 'non-voting member'})")
                    return
            except (OSError, P2PGenError):
                pass
            time.sleep(0.2)
        say(f"{addr} is not in Raft epoch {epoch} after {self.timeout:.0f} s (it keeps trying by itself)")
