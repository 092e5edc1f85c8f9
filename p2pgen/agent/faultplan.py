"""The fault planner: the rules every fault schedule keeps, and the seeded planner of `p2pgen join --local --chaos`.

Owns, for every harness that injects faults into a live job (`join --local --chaos`, `p2pgen stress`, `p2pgen
chaos`):
- the minority rule (`keeps_quorum`): a fault that takes Raft voters down is allowed only while, counting the
  voters already down, at most a minority of them is down after it; `voters_outlive` applies it to an agent's
  `show` view (chaos's applications, each voter judged by `voter_is_up`), `p2pgen_lab.stress.plan.quorum_safe`
  to the stress harness's world;
- the seeded weighted choice of a fault kind (`pick_weighted`: one uniform draw per choice, whatever the weights);
- `LocalPlan`, the planner of `join --local --chaos`: when the next fault is due, which kind, on which peer, under
  the minority rule in its strictest form (a whole host only while every voter is a live agent, `all_voters_live`)
  and at most MAX_FAULTS_IN_FLIGHT unrecovered faults at a time.
The agents are started and killed through one launcher (`p2pgen.agent.launch`) in all three.

Why the planner lives in the runtime: `join --local --chaos` is a runtime command, and the runtime never imports
the lab; the lab's harnesses import these rules from here (the stress plan draws its actions over them; chaos's
applications check them at their injection points). What stays in the lab is what only a lab harness does: the
stress plan's actions (pauses, partitions, host cuts), and chaos's schedules, decided before a run because they
fire at named points inside the application and every policy must meet the same list.

Invariants kept: every function is a pure function of its arguments (no I/O, no clock); a planner draws from its
`random.Random` in a fixed order, documented per method, so one seed replays one sequence of faults.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence

from p2pgen.core.voters import majority_up

MAX_FAULTS_IN_FLIGHT = 2       # unrecovered faults at a time (the job keeps at least N-2 members training)
LAST_FAULT_FRACTION = 0.8      # no fault after this share of --steps: the last recovery must fit before the end
GAP_SPREAD = (0.5, 1.5)        # a gap between faults is the mean gap times a uniform draw in this range
APPLICATION, HOST = "application", "host"


def keeps_quorum(voters: int, down: int, taken_down: int) -> bool:
    """The minority rule: after `taken_down` more voters go down, a majority of the `voters` is still up.

    Args:
        voters: the voters in the Raft configuration.
        down: how many of them are down already (killed and not yet removed, stopped, cut off, leaving).
        taken_down: how many more the fault takes down.
    """
    return majority_up(voters, down + taken_down)


def voters_outlive(raft: dict, victims: Collection[str], is_up: Callable[[dict], bool]) -> bool:
    """Whether the voters of `raft` (the `raft` part of an agent's `show`) that are up, less those whose agents are
    `victims`, are still a majority of the voters (True when the view does not say who votes).

    Args:
        raft: the view, with `voters` as a list of {"node", "agent"}.
        victims: the agent addresses the fault takes down.
        is_up: whether one voter is up now.
    """
    if "voters" not in raft:
        return True
    voters = raft["voters"]
    return keeps_quorum(len(voters), 0, sum(v["agent"] in victims or not is_up(v) for v in voters))


def voter_is_up(voter: dict, shown: dict | None) -> bool:
    """Whether one voter counts as up for the minority rule, judged from its own agent's `show` asked now: the
    agent answers, still runs that voter node (a replacement at the same address runs another) and is not leaving
    (`agent.leaving`: a leaving voter removes itself soon, whatever made its agent leave).

    Args:
        voter: one entry of `raft.voters`, {"node", "agent"}.
        shown: what `show` answered at `voter["agent"]`, None when it did not answer.
    """
    return shown is not None and shown["raft"].get("self") == voter["node"] and not shown["agent"].get("leaving")


def all_voters_live(voters: Collection[str], live_nodes: Collection[str], formed: int) -> bool:
    """The minority rule with nothing down: every voter is the node of a live agent, and there are as many voters
    as when the job first formed (`formed`), so that killing one whole host can never cost the quorum.

    Args:
        voters: the node ids of the voters.
        live_nodes: the node ids of the agents that run and answer.
        formed: the voters when the job was first whole.
    """
    return set(voters) <= set(live_nodes) and len(voters) >= formed


def pick_weighted(kinds: Sequence[str], weights: Sequence[int], u: float) -> str:
    """The kind that the uniform draw `u` in [0, 1) falls on, each kind taking a share of [0, 1) in proportion to
    its weight, in the order of `kinds`.

    Args:
        kinds: the kinds to choose from (at least one).
        weights: their weights, in the same order.
        u: one uniform draw.
    """
    total, acc = sum(weights), 0.0
    for kind, w in zip(kinds, weights):
        acc += w / total
        if u < acc:
            return kind
    return kinds[-1]


class LocalPlan:
    """The fault schedule of `join --local N --chaos MEAN`: seeded, drawn as the job goes.

    A fault is due MEAN committed steps (with --steps and a COMMAND: `counts_steps`) or MEAN seconds after the
    previous one, times a draw in GAP_SPREAD. Its kind comes from a bag refilled with one application kill and one
    host kill in a seeded order (host kills only without a COMMAND, application kills only below 3 agents: two
    voters cannot lose one). Its peer is a seeded choice among those it may hit now. Draws, in order: one uniform
    per gap (`due_after`), one shuffle per refill of two kinds (`kind`), one choice per fault (`target`).
    """

    def __init__(self, mean: float | None, seed: int, agents: int, with_application: bool,
                 steps: int | None) -> None:
        """Args:
            mean: the mean gap between faults (None or 0: no fault).
            seed: the seed of every draw.
            agents: the number of agents of the job.
            with_application: the agents supervise a COMMAND.
            steps: the job's --steps, if given.
        """
        self.mean, self.agents, self.with_application, self.steps = mean, agents, with_application, steps
        self.rng = random.Random(seed)
        self._kinds: list[str] = []

    @property
    def counts_steps(self) -> bool:
        """With --steps and a COMMAND, the mean gap is a number of committed steps, else seconds."""
        return self.with_application and self.steps is not None

    def last_fault_revision(self) -> int:
        """No fault is injected past this revision (counts_steps only)."""
        return int((self.steps or 0) * LAST_FAULT_FRACTION)

    def due_after(self, revision: int, now: float) -> float | None:
        """When the next fault is due: a revision (counts_steps) or a monotonic time; None without chaos.

        Args:
            revision: the job's revision when the previous fault was injected (or 0).
            now: the monotonic time then.
        """
        if not self.mean:
            return None
        gap = self.mean * self.rng.uniform(*GAP_SPREAD)
        return revision + gap if self.counts_steps else now + gap

    def kind(self) -> str:
        """The kind of the next fault (the same until `injected` is called)."""
        if not self._kinds:
            if not self.with_application:
                self._kinds = [HOST]
            elif self.agents < 3:
                self._kinds = [APPLICATION]   # two voters: killing either agent would stop Raft until it is back
            else:
                self._kinds = [APPLICATION, HOST]
                self.rng.shuffle(self._kinds)
        return self._kinds[-1]

    def injected(self) -> None:
        """The fault of `kind()` was injected: the next call draws the next kind."""
        self._kinds.pop()

    @staticmethod
    def may_fault(recovering: Collection[int]) -> bool:
        """Whether another fault may be injected while the peers `recovering` are not back yet."""
        return len(recovering) < MAX_FAULTS_IN_FLIGHT

    def target(self, kind: str, candidates: dict[int, bool], recovering: Collection[int],
               quorum_safe: bool) -> int | None:
        """The peer to fault now, or None while none may be: never one still recovering, only a member of the active
        generation, an application only while its pid is known, a host only while `quorum_safe`.

        Args:
            kind: APPLICATION or HOST.
            candidates: the peers that answered and are members of the active generation -> whether their
                application's pid is known.
            recovering: the peers whose last fault has not recovered yet.
            quorum_safe: `all_voters_live` holds for the job now (with every agent running and answering).
        """
        if kind == HOST and not quorum_safe:
            return None
        eligible = sorted(i for i, has_app in candidates.items() if i not in recovering and (kind == HOST or has_app))
        if not eligible:
            return None
        return self.rng.choice(eligible)
