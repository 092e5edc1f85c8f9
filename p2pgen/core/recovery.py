"""`p2pgen recover`'s decision: may the survivors re-form the job in a new Raft epoch, and from whose state?

Owns: `plan_recovery`, a pure function of what the survivors answered (each one's Raft epoch, the voter it runs,
the voters it knows, whether it hears a leader, the (term, index) it applied) and of the agents the operator
names as gone for good. It returns the plan (new epoch, seed, followers) or a refusal with its reason.
Rules (etcd's `--force-new-cluster` is the model, fenced):
- refused while any answering agent hears a leader in the newest epoch, or while a majority of that epoch's
  voters answers (they can still elect one: nothing to recover), or when an agent named gone answers;
- the seed is the survivor that applied the most ((term, index) of its last applied entry; ties: the
  smallest address), so no entry any survivor applied is lost and numbers keep going up;
- the new epoch is one above the newest epoch any survivor is in. Its keys differ, so no node of an older
  epoch can talk to it (fencing); only the operator's word that the others are gone makes it safe.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Survivor:
    addr: str                        # control address
    epoch: int
    node: str                        # the voter id it runs, "" for a non-voting member
    voters: tuple[str, ...]          # the voters of its epoch it knows
    leader: str                      # the leader it hears now, "" if none
    applied: tuple[int, int]         # (term, index) of its last applied entry


@dataclass(frozen=True)
class RecoveryPlan:
    ok: bool
    reason: str
    epoch: int = 0
    seed: str = ""
    followers: tuple[str, ...] = ()


def plan_recovery(survivors: tuple[Survivor, ...], gone: frozenset[str]) -> RecoveryPlan:
    if not survivors:
        return RecoveryPlan(False, "no agent answered: name at least one live agent with --peer")
    back = sorted(s.addr for s in survivors if s.addr in gone)
    if back:
        return RecoveryPlan(False, f"{', '.join(back)} answer(s): an agent named --gone must be gone for good")
    epoch = max(s.epoch for s in survivors)
    current = [s for s in survivors if s.epoch == epoch]
    led = [s for s in current if s.leader]
    if led:
        return RecoveryPlan(False, f"agent {led[0].addr} hears leader {led[0].leader} in Raft epoch {epoch}: the job "
                                   "has a quorum, nothing to recover")
    voters = sorted({v for s in current for v in s.voters})
    answering = sorted({s.node for s in current if s.node and s.node in voters})
    if len(answering) * 2 > len(voters):
        return RecoveryPlan(False, f"a majority of Raft epoch {epoch}'s voters answers ({len(answering)} of "
                                   f"{len(voters)}: {', '.join(answering)}): they can elect a leader by "
                                   "themselves; wait, or look for a partition")
    seed = min(current, key=lambda s: (-s.applied[0], -s.applied[1], s.addr))
    followers = tuple(sorted(s.addr for s in survivors if s.addr != seed.addr))
    return RecoveryPlan(True, f"{len(answering)} of {len(voters)} voters of Raft epoch {epoch} answer: re-forming "
                              f"in epoch {epoch + 1} from {seed.addr} (applied up to term {seed.applied[0]}, "
                              f"index {seed.applied[1]})", epoch + 1, seed.addr, followers)

