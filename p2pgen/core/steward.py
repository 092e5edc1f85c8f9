"""What an agent decides about its own member, from the replicated state: pure rules its driver's
level-triggered reconcile applies every turn (the driver performs them: Raft submits, process launches).

Owns: when a dead application's next incarnation may start, when the agent owes a `ready` vote on its
member's behalf, when it may start a warm standby (`p2pgen join --standby 1`), when a member asked to
leave must first hand the job's state over, and how a drain (a leave with a deadline: SIGTERM, a spot notice)
goes: hand the state over, then stop the application at a step boundary, then leave, each bounded so that the
agent is gone by the deadline. Eviction is the machine's own `was_evicted`.
Invariants kept:
- a death is visible in the history as its own certified generation: the next incarnation starts once the
  job certified a generation without the dead one, unless nobody can (no member left, or the pending proposal
  is held waiting for state this host may bring back), or the bounded wait is over;
- the agent votes at most once per (pending generation, incarnation), and only for its own current member;
- a warm standby never competes for the CPU with its application's own start: it starts once the application
  runs in the active generation (its start-up is over), or after a bounded wait;
- a member asked to leave never takes the only copy of the job's state with it while another member can
  take it (a registered one, or one whose application is restarting: its agent reported the local copy it
  left, `Kept`), however far behind that copy is; the only copy being its running process (it alone is the
  active generation) or the local copy its own dead application left on this host, which the job waits for.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2pgen.core.generation import GenerationMachine

LEAVE_RESERVE_S = 10.0      # a drain leaves at the latest this long before its deadline (recording the leave)


@dataclass(frozen=True)
class Drain:
    """A drain under way (times on one monotonic clock): asked at `since`, the agent must be gone by
    `deadline`; `hand_over_wait` is the longest it waits for another member to take the state (--regress-wait);
    `app_asked`, when it asked its application to stop at the next step boundary (None: not yet)."""

    since: float
    deadline: float
    hand_over_wait: float
    app_asked: float | None = None

    @property
    def leave_by(self) -> float:
        """When the agent stops waiting for anything and leaves."""
        return max(self.since, self.deadline - LEAVE_RESERVE_S)


def drain_asked(current: Drain | None, now: float, timeout: float, until_taken: float | None,
                hand_over_wait: float) -> Drain | None:
    """The drain after a request to leave (SIGTERM, the `leave` RPC, a spot notice): gone within `timeout`
    seconds, or before the machine is taken if earlier; a second request can only bring the deadline forward
    (None: the drain under way already ends earlier, it stands).

    Args:
        current: the drain under way, if any.
        now: the monotonic clock.
        timeout: the longest drain (`--drain-timeout`).
        until_taken: seconds until the machine is taken, if the notice said (never below 0).
        hand_over_wait: the longest wait for another member to take the state (--regress-wait).
    """
    left = timeout if until_taken is None else min(timeout, max(0.0, until_taken))
    if current is not None and now + left >= current.deadline:
        return None
    if current is None:
        return Drain(now, now + left, hand_over_wait)
    return Drain(current.since, now + left, hand_over_wait, current.app_asked)


def drain_step(drain: Drain, now: float, hand_over: bool, app_stoppable: bool) -> tuple[str, str]:
    """The next move of a drain, with its reason: "stay" (the application trains on, holding the only copy of
    state another member can take), "stop_app" (ask the application to stop at its next step boundary: it
    finishes or abandons the step in flight, then exits, and the others go on without waiting for a detector),
    "wait_app" (asked, not yet stopped) or "leave" (record the leave and go: nothing left to wait for, or no
    time left).

    Args:
        drain: the drain under way.
        now: the monotonic clock.
        hand_over: `hand_over_due` holds (this peer alone holds steps another member can take).
        app_stoppable: an application of this peer runs and takes its steps through p2pgen (attached), so it
            can stop at a boundary.
    """
    if now >= drain.leave_by:
        return "leave", "the drain's deadline is near: leave now"
    if hand_over and now < drain.since + drain.hand_over_wait:
        return "stay", "this peer alone holds steps of the job's state that another member can take"
    if not app_stoppable:
        return "leave", "no application of this peer takes steps: nothing to stop at a boundary"
    if drain.app_asked is None:
        return "stop_app", "the application stops at its next step boundary"
    return "wait_app", "the application finishes its step in flight"


def relaunch_due(machine: GenerationMachine, identity: tuple[str, int], now: float, due: float) -> bool:
    """Whether the application of `identity` (which died) may be started again as a new incarnation now."""
    in_active = machine.active is not None and identity in {m.identity for m in machine.active.members}
    held = machine.pending is not None and machine.pending.hold is not None
    return not (in_active and machine.members and not held and now < due)


def vote_owed(machine: GenerationMachine, peer_id: str, incarnation: int,
              voted: tuple[int, int] | None) -> int | None:
    """The pending generation the agent must vote `ready` for on behalf of `peer_id#incarnation` (its member,
    whose application did not attach), or None. `voted`: the (generation, incarnation) it last voted for."""
    pending = machine.pending
    if pending is None or voted == (pending.generation, incarnation):
        return None
    member = pending.member(peer_id)
    if member is None or member.incarnation != incarnation:
        return None
    return pending.generation


def standby_due(machine: GenerationMachine, identity: tuple[str, int] | None, app_age: float, settle: float,
                quiet_for: float, quiet: float) -> bool:
    """Whether the agent, which has no standby now, may start one for its application `identity` (its live
    current incarnation, None while there is none: the dead one's successor is about to start and takes the
    CPU first). Due once that incarnation is a member of the active generation and that generation has been
    active for `quiet` seconds (`quiet_for`, as the agent saw it: the first steps after a heal are over), or
    `settle` seconds after it started (`app_age`) if it never gets there (a job waiting for more members)."""
    if identity is None:
        return False
    running = machine.active is not None and identity in {m.identity for m in machine.active.members}
    return (running and quiet_for >= quiet) or app_age >= settle


def hand_over_due(machine: GenerationMachine, identity: tuple[str, int | None], now: float,
                  local: tuple[int, int] | None = None) -> bool:
    """Whether the peer of `identity`, asked to leave, must stay until another member holds the job's state.

    Two ways it alone can hold steps the job needs, each only while another member can take them (one is
    registered, or on its way back: its agent reported the copy its dead application left, and the job still
    waits for it, `GenerationMachine.kept_deadline`):
    - its member alone is the active generation (every step since the last change exists only in its process);
    - its own application died and the local copy it left on this host (`local`, which its agent reported as
      `Kept`) is above every revision another member is known to hold: the job waits for that copy, so the
      next incarnation must restore it, vote and hand it over before the agent deletes it by leaving.

    Args:
        machine: the replicated state as this agent applied it.
        identity: (peer id, its registered incarnation, or None while its application restarts).
        now: wall-clock time, to judge the deadlines of `Kept` notes.
        local: (revision, generation) of the local copy on this host, None without one.
    """
    if not _someone_to_take_it(machine, identity[0], now):
        return False
    return alone_active(machine, identity) or _holds_the_only_copy(machine, identity, now, local)


def alone_active(machine: GenerationMachine, identity: tuple[str, int | None]) -> bool:
    """Whether the member `identity` alone is the active generation."""
    active = machine.active
    return active is not None and [m.identity for m in active.members] == [identity]


def _someone_to_take_it(machine: GenerationMachine, peer_id: str, now: float) -> bool:
    others = [m for m in machine.members if m.peer_id != peer_id]
    returning = [k for k in machine.kept.values() if k.peer_id != peer_id and now < machine.kept_deadline(k)]
    return bool(others or returning)


def _holds_the_only_copy(machine: GenerationMachine, identity: tuple[str, int | None], now: float,
                         local: tuple[int, int] | None) -> bool:
    """The best revision this peer holds (the local copy on this host, while the job waits for it or its
    registered member will vote with it; its vote), on the job's history, is above what every other member
    is known to hold (their votes; the active generation's frontier when another member is in it). Never
    while its member trains in an active generation with others: they commit every step it commits."""
    peer_id = identity[0]
    active = machine.active
    in_active = active is not None and identity in {m.identity for m in active.members}
    if active is not None and in_active and len(active.members) > 1:
        return False
    held: list[int] = []
    kept = machine.kept.get(peer_id)
    awaited = kept is not None and now < machine.kept_deadline(kept)     # the job waits for this host's copy
    registered = identity[1] is not None and machine.is_current(peer_id, identity[1])   # its vote will carry it
    if local is not None and (awaited or registered) and machine.left_behind(local[1], local[0]) is None:
        held.append(local[0])
    pending = machine.pending
    if pending is not None and peer_id in pending.votes:
        held.append(pending.votes[peer_id].revision)
    if not held:
        return False
    others = [v.revision for p, v in pending.votes.items() if p != peer_id] if pending is not None else []
    if active is not None and any(m.peer_id != peer_id for m in active.members):
        others.append(active.frontier.revision)
    return max(held) > max(others, default=-1)
