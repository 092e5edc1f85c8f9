"""The stress test's fault plan: which action next, on whom, under the minority rule. Pure and seeded.

`choose(rng, world)` picks one action from what the harness currently knows (`World`): the agents
with their state and whether their Raft node is a voter, and how many voters are down. Every call draws
the same number of values from `rng` whatever the world holds, so one seed replays one sequence of
draws; the world decides which of the drawn choices are possible.

Actions (weights in KINDS):
- `kill_app`:   SIGKILL one application (its agent restarts it as a new incarnation);
- `kill_agent`: SIGKILL one whole agent with its application; its replacement starts REPLACE_AFTER_S
  later at the same control address under the same peer id (a lost spot host coming back);
- `kill_two`:   SIGKILL two agents within KILL_TWO_GAP_S of each other, each replaced later
  (REPLACE_TWO_AFTER_S after its kill);
- `pause`:      SIGSTOP an agent (scope `agent`: the agent process alone; `host`: the agent with its
  application) for PAUSE_S, then SIGCONT;
- `join`:       a new peer id joins at a fresh address (while fewer than `max_agents` are live);
- `leave`:      a member leaves gracefully (SIGTERM to its agent; while more than `min_agents` are live);
- `partition`:  cut a minority of the agents (1 up to the most the minority rule allows) off the others, through
  `p2pgen.faults` (scope `both`: symmetric; `one_way`: only what the minority sends is dropped), healed
  HEAL_S later; one partition at a time, and its minority counts as down until the heal.
Only when every agent runs in its own emulated host (`World.hosts`; `p2pgen stress --hosts N`):
- `host_cut`:   one host's link goes down (its own `ip link set eth0 down`) for HOST_CUT_S, then up;
- `zone_partition`: the largest minority the rule allows (at least two hosts) loses its routes to the other
  hosts, both ways, for HEAL_S; inside each side traffic flows.
One network fault (partition, host cut or zone partition) at a time; its cut agents count as down until it heals.
Minority rule (`quorum_safe`, over the runtime planner's `p2pgen.agent.faultplan.keeps_quorum`, the rule
`join --local --chaos` and chaos's applications keep too; the weighted pick is the planner's as well): an action
that takes agents down (kill_agent, kill_two, pause, leave, partition) is possible only if, counting the voters
already down, at most a minority of the voters is down after it: down <= (voters - 1) // 2. Down means killed
and not yet removed from the voters, stopped, or leaving. An application kill never takes a voter down.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from p2pgen.agent.faultplan import keeps_quorum, pick_weighted
from p2pgen.core.voters import majority_up as majority_up  # the harness's majority timeline reads it here

KINDS: dict[str, int] = {"kill_app": 3, "kill_agent": 2, "kill_two": 1, "pause": 2, "join": 1, "leave": 1,
                         "partition": 2, "host_cut": 2, "zone_partition": 1}
HOST_KINDS = ("host_cut", "zone_partition")      # possible only on emulated hosts
DELAY_S = (0.5, 3.0)                 # between two actions
PAUSE_S = (0.3, 3.0)
KILL_TWO_GAP_S = (0.0, 0.3)
REPLACE_AFTER_S = 1.0
REPLACE_TWO_AFTER_S = (1.0, 4.0)
HEAL_S = (1.0, 10.0)
HOST_CUT_S = (0.5, 4.0)
TAKES_DOWN = ("kill_agent", "kill_two", "pause", "leave", "partition", *HOST_KINDS)


@dataclass(frozen=True)
class Agent:
    """What the harness knows about one agent slot (a peer id at a control address) right now."""

    peer: str
    up: bool                         # its current process runs and is not stopped
    voter: bool                      # its current Raft node is a voter
    has_app: bool = True             # its application's pid is known (it can be killed)


@dataclass(frozen=True)
class World:
    agents: tuple[Agent, ...]        # live slots (not left), in a stable order
    voters: int                      # voters in the Raft configuration
    voters_down: int                 # of those, how many have no running, unstopped process
    max_agents: int
    min_agents: int
    can_join: bool = True            # a fresh address is available
    can_partition: bool = True       # no network fault is in place
    hosts: bool = False              # every agent runs in its own emulated host: host faults are possible

    @property
    def up(self) -> list[Agent]:
        return [a for a in self.agents if a.up]


@dataclass(frozen=True)
class Action:
    kind: str
    targets: tuple[str, ...] = ()
    seconds: float = 0.0             # pause: how long; kill_two: gap between the kills; partition, host_cut,
                                     # zone_partition: until the heal
    replace_after: tuple[float, ...] = ()
    scope: str = ""                  # pause: "agent" or "host"; partition: "both" or "one_way"
    skipped: str = ""                # why nothing was done (no action possible)

    def describe(self) -> str:
        who = " and ".join(self.targets)
        if self.kind == "kill_app":
            return f"SIGKILL the application of {who}"
        if self.kind == "kill_agent":
            return f"SIGKILL agent {who}; replacement at the same address in {self.replace_after[0]:.1f} s"
        if self.kind == "kill_two":
            return (f"SIGKILL agents {who} {self.seconds:.2f} s apart; replacements "
                    f"{', '.join(f'{r:.1f}' for r in self.replace_after)} s after each kill")
        if self.kind == "pause":
            return f"SIGSTOP {'agent' if self.scope == 'agent' else 'host (agent + application)'} {who} " \
                   f"for {self.seconds:.2f} s"
        if self.kind == "join":
            return f"new peer {who} joins"
        if self.kind == "leave":
            return f"{who} leaves gracefully"
        if self.kind == "partition":
            how = "both ways" if self.scope == "both" else "one way (what they send is dropped)"
            return f"partition {who} off the others {how}; healed in {self.seconds:.1f} s"
        if self.kind == "host_cut":
            return f"the host of {who} loses its link (ip link set eth0 down); up again in {self.seconds:.1f} s"
        if self.kind == "zone_partition":
            return f"zone partition: the hosts of {who} lose their routes to the others; healed in {self.seconds:.1f} s"
        return f"nothing ({self.skipped})"


@dataclass
class Draws:
    """The values one action consumes from the rng, always the same count."""

    kind: float
    first: float
    second: float
    seconds: float
    gap: float
    replace: tuple[float, float]
    scope: float
    heal: float
    size: float

    @classmethod
    def take(cls, rng: random.Random) -> Draws:
        return cls(rng.random(), rng.random(), rng.random(), rng.uniform(*PAUSE_S), rng.uniform(*KILL_TWO_GAP_S),
                   (rng.uniform(*REPLACE_TWO_AFTER_S), rng.uniform(*REPLACE_TWO_AFTER_S)), rng.random(),
                   rng.uniform(*HEAL_S), rng.random())


def next_delay(rng: random.Random, mean: float | None = None) -> float:
    """Seconds until the next action: uniform over DELAY_S, scaled to average `mean` when it is given (the same
    draw either way, so one seed replays one plan at another rate)."""
    draw = rng.uniform(*DELAY_S)
    return draw if mean is None else draw * mean / (sum(DELAY_S) / 2)


def quorum_safe(world: World, targets: list[Agent]) -> bool:
    """Taking `targets` down leaves at most a minority of the voters down."""
    return keeps_quorum(world.voters, world.voters_down, sum(1 for a in targets if a.voter and a.up))


def choose(rng: random.Random, world: World, new_peer: str = "", kinds: tuple[str, ...] = ()) -> Action:
    """One action for `world` (`new_peer`: the peer id a join would start; `kinds`: only these, if given)."""
    d = Draws.take(rng)
    options = {k: v for k, v in _possible(world, new_peer).items() if not kinds or k in kinds}
    if not options:
        return Action("none", skipped="no action keeps a majority of the voters up")
    kinds = [k for k in KINDS if k in options]
    kind = pick_weighted(kinds, [KINDS[k] for k in kinds], d.kind)
    candidates = options[kind]
    if kind == "join":
        return Action("join", (new_peer,))
    if kind == "kill_two":
        a, b = candidates[int(d.first * len(candidates))]
        return Action("kill_two", (a.peer, b.peer), seconds=d.gap, replace_after=d.replace)
    if kind == "partition":
        most = max(len(c) for c in candidates)
        size = 1 + int(d.size * most)
        sized = [c for c in candidates if len(c) == size]
        minority = sized[int(d.first * len(sized))]
        return Action("partition", tuple(a.peer for a in minority), seconds=d.heal,
                      scope="both" if d.scope < 0.5 else "one_way")
    if kind == "zone_partition":
        zone = candidates[int(d.first * len(candidates))]
        return Action("zone_partition", tuple(a.peer for a in zone), seconds=d.heal, scope="both")
    target = candidates[int(d.first * len(candidates))][0]
    if kind == "host_cut":
        low, high = HOST_CUT_S
        return Action("host_cut", (target.peer,), seconds=low + d.size * (high - low))
    if kind == "kill_agent":
        return Action("kill_agent", (target.peer,), replace_after=(REPLACE_AFTER_S,))
    if kind == "pause":
        return Action("pause", (target.peer,), seconds=d.seconds, scope="agent" if d.scope < 0.5 else "host")
    return Action(kind, (target.peer,))


def _possible(world: World, new_peer: str) -> dict[str, list[tuple[Agent, ...]]]:
    """kind -> the target tuples it may act on now (empty kinds left out)."""
    up = world.up
    singles = [(a,) for a in up if quorum_safe(world, [a])]
    options: dict[str, list[tuple[Agent, ...]]] = {
        "kill_app": [(a,) for a in up if a.has_app],
        "kill_agent": singles if len(up) > 1 else [],
        "kill_two": [(a, b) for i, a in enumerate(up) for b in up[i + 1:] if quorum_safe(world, [a, b])]
        if len(up) > 2 else [],
        "pause": singles if len(up) > 1 else [],
        "join": [()] if new_peer and world.can_join and len(world.agents) < world.max_agents else [],
        "leave": singles if len(world.agents) > world.min_agents else [],
        "partition": _minorities(world) if world.can_partition and len(up) > 2 else [],
        "host_cut": singles if world.hosts and world.can_partition and len(up) > 2 else [],
        "zone_partition": [m for m in _minorities(world) if len(m) == 2]
        if world.hosts and world.can_partition else [],
    }
    return {k: v for k, v in options.items() if v}


def _minorities(world: World) -> list[tuple[Agent, ...]]:
    """Every set of up agents that may be cut off (a minority under the minority rule), smallest first, in the
    agents' stable order; at most two agents."""
    up = world.up
    ones = [(a,) for a in up if quorum_safe(world, [a]) and len(up) > 2]
    twos = [(a, b) for i, a in enumerate(up) for b in up[i + 1:] if quorum_safe(world, [a, b]) and len(up) > 4]
    return ones + twos


@dataclass
class Timeline:
    """When a majority of the voters was up: (start, end) intervals, built from samples in time order."""

    intervals: list[tuple[float, float]] = field(default_factory=list)
    _since: float | None = None

    def sample(self, t: float, majority_up: bool) -> None:
        if majority_up and self._since is None:
            self._since = t
        elif not majority_up and self._since is not None:
            self.intervals.append((self._since, t))
            self._since = None

    def close(self, t: float) -> list[tuple[float, float]]:
        if self._since is not None:
            self.intervals.append((self._since, t))
            self._since = None
        return self.intervals


def voter_status(slots: list[tuple[str, str, str | None]],
                 voters: list[tuple[str, str]] | None) -> tuple[int, int, set[str]]:
    """(voters, voters down, peers whose current node votes) from the harness's slots (peer, state, node
    id of its current process; state up | stopped | down | left) and the voters `show` lists as (node id,
    agent address). A voter is up only if the process that holds its node id runs unstopped: a replaced
    agent at the same address is a new node, so the voter it replaced stays down until it is removed.
    Before any observation (`voters` None) every slot not left counts as a voter."""
    if voters is None:
        live = [(peer, state) for peer, state, _ in slots if state != "left"]
        return len(live), sum(1 for _, state in live if state != "up"), {peer for peer, _ in live}
    running = {node: peer for peer, state, node in slots if state == "up" and node}
    voting = {running[node] for node, _ in voters if node in running}
    return len(voters), len(voters) - len(voting), voting

