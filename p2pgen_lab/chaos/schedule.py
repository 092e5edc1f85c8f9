"""Seeded fault schedules: which fault, at which named point, in which peer, from which revision.

A schedule is policy-independent: the same list runs under every policy, so the policies are compared on
identical faults. That is why it is drawn before the run, not by the runtime planner as the job goes
(`p2pgen.agent.faultplan`, which `join --local --chaos` and the stress plan use); the planner's minority rule is
kept at injection time instead, by the application (`voters_outlive`, before every agent kill).
`generate(seed, n)` is a pure function of its arguments (one `random.Random` per schedule, seeded from
(seed, index)), so `p2pgen chaos --seed S` replays exactly the same injections.

Injection points (see `app.py` for where each one sits in the step):
- step points, in order: before_allreduce, mid_allreduce (after the member posted frame k of the first
  gradient all-reduce, k capped to a frame it surely posts: of its ring, or of its shared-memory barrier),
  between_buckets (between the two gradient all-reduces), after_allreduce
  (before the optimizer), mid_optimizer (momentum written, weights not), after_commit;
- transition points: pending (after this member voted `ready` for a pending generation, before it is
  synced/active), catch_up (this member was told to pull: it, or its first source, is hit as the
  transfer starts).
Partition kinds (`p2pgen.faults`, carried out by the harness, healed `heal_s` later, 1-10 s drawn from a
random stream of their own so that adding them left the other draws of a seed unchanged): `partition` cuts
the injecting peer's agent off the others both ways, `partition_one_way` drops only what it sends, and
`partition_majority` has the injecting peer on the majority side: it cuts another agent off both ways.
An injection fires once, the first time its peer reaches its point at a revision >= its revision; an
injection whose peer never gets there (it left, or no transition happened) is not counted as injected.

Sharded schedules (`generate(..., sharded=True)`, `smoke_sharded()`: the mini-training also keeps a sharded
object, see `model`) add faults during repartition, drawn from a random stream of their own (the unsharded
schedules of a seed are unchanged), every other injection being one of them:
- `kill_shard_source` at `shard_pull` (peer `*`: whichever member pulls a shard first, at a revision >= the
  injection's): after the first chunk of a shard arrived, SIGKILL the application serving it (a source dying
  mid-shard); the puller must finish the shard from another owner, or not report `synced`;
- `stale_replica`: the application comes back holding its state and shards of STALE_BACK commits ago (its
  local copy lost, an older copy of its own found), and offers them in its vote: never a source; the
  application of the other owner of its first shard is SIGKILLed with it (its local copy kept), so that for a
  while the stale copy may be the only one offered for that shard;
- `reuse_rank`: the agent is replaced at its address within 0.2 s (its peer id and rank reused, the local
  copy lost) and the new process starts from the state and shards that the member of the next rank saved:
  another rank's shards, which the new ownership map, not the rank, decides about.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

STEP_POINTS = ("before_allreduce", "mid_allreduce", "between_buckets", "after_allreduce", "mid_optimizer",
               "after_commit")
TRANSITION_POINTS = ("pending", "catch_up")
SHARD_POINTS = ("shard_pull",)          # a member received the first chunk of a shard it pulls

# kind -> (weight, points it may hit)
KINDS: dict[str, tuple[int, tuple[str, ...]]] = {
    "kill_app": (30, STEP_POINTS + TRANSITION_POINTS),        # SIGKILL the application; its agent restarts it
    "kill_agent": (10, STEP_POINTS + TRANSITION_POINTS),      # SIGKILL this peer's agent (the app dies with it)
    "replace_agent": (8, STEP_POINTS + TRANSITION_POINTS),    # the same, replaced at its address within 1 s
    "kill_two_agents": (6, STEP_POINTS + TRANSITION_POINTS),  # SIGKILL another agent, then this one, 0.2 s apart
    "kill_leader": (8, STEP_POINTS + TRANSITION_POINTS),      # SIGKILL the Raft leader's agent
    "pause_short": (7, STEP_POINTS),                          # SIGSTOP shorter than detection, then SIGCONT
    "pause_long": (7, STEP_POINTS),                           # SIGSTOP longer than detection, then SIGCONT
    "kill_source": (8, ("catch_up",)),                        # SIGKILL the first catch-up source's application
    "leave": (6, ("after_commit",)),                          # scale-down: a clean exit at a step boundary
    "join": (8, STEP_POINTS),                                 # scale-up: a new peer starts
    "partition": (6, STEP_POINTS),                            # this agent cut off from the others, both ways
    "partition_one_way": (4, STEP_POINTS),                    # what this agent sends is dropped
    "partition_majority": (4, STEP_POINTS),                   # this agent cuts another one off, both ways
}
SHARD_KINDS: dict[str, tuple[int, tuple[str, ...]]] = {
    "kill_shard_source": (10, SHARD_POINTS),                  # SIGKILL a shard's source mid-shard
    "stale_replica": (8, STEP_POINTS),                        # come back with an older revision of its shards
    "reuse_rank": (8, STEP_POINTS),                           # replaced fast, starts from another rank's shards
}
ANY_PEER = "*"                   # kill_shard_source: whichever member gets to the point first
STALE_BACK = 3                   # stale_replica: the copy is this many commits old
PARTITIONS = ("partition", "partition_one_way", "partition_majority")
HEAL_S = (1.0, 10.0)
MEMBERS = 4
SPACING = 7                      # revisions between consecutive injections of one schedule


@dataclass(frozen=True)
class Injection:
    kind: str
    point: str
    peer: str
    revision: int
    frame: int = 0               # mid_allreduce only: fire after sending this many frames (+1)
    heal_s: float = 0.0          # partition kinds only: seconds until the harness heals it

    @property
    def name(self) -> str:
        return f"{self.kind}@{self.point}:{self.peer}:r{self.revision}"


@dataclass(frozen=True)
class Schedule:
    seed: int
    index: int
    members: int
    steps: int
    injections: tuple[Injection, ...]

    def to_json(self) -> dict:
        return {"seed": self.seed, "index": self.index, "members": self.members, "steps": self.steps,
                "injections": [asdict(i) for i in self.injections]}


def smoke() -> list[Schedule]:
    """The CI schedules: fixed, short, and aimed where a policy without a frontier must fail (a member
    killed between its all-reduce and its commit, or mid-optimizer, comes back one step behind; a joiner
    comes with no state), while certified recovery must pass."""
    return [
        Schedule(0, 0, MEMBERS, 14, (Injection("kill_app", "after_allreduce", "p1", 4),
                                     Injection("kill_app", "mid_allreduce", "p2", 8, frame=4))),
        Schedule(0, 1, MEMBERS, 14, (Injection("kill_agent", "mid_optimizer", "p3", 4),
                                     Injection("join", "before_allreduce", "p0", 8))),
    ]


def smoke_sharded() -> list[Schedule]:
    """The sharded CI schedules: each repartition fault once, short. A stale replica comes back and pulls its
    shards while one of their sources dies mid-shard; a joiner receives shards while its source dies, and a
    replaced member starts from another rank's shards."""
    return [
        Schedule(0, 0, MEMBERS, 16, (Injection("stale_replica", "after_commit", "p1", 5),
                                     Injection("kill_shard_source", "shard_pull", ANY_PEER, 5),
                                     Injection("reuse_rank", "before_allreduce", "p2", 10))),
        Schedule(0, 1, MEMBERS, 16, (Injection("join", "before_allreduce", "p0", 4),
                                     Injection("kill_shard_source", "shard_pull", ANY_PEER, 4),
                                     Injection("reuse_rank", "mid_optimizer", "p3", 10))),
    ]


def generate(seed: int, count: int, injections: int = 4, sharded: bool = False) -> list[Schedule]:
    return [_one(seed, i, injections, sharded) for i in range(count)]


def _one(seed: int, index: int, n: int, sharded: bool = False) -> Schedule:
    rng = random.Random(f"p2pgen-chaos/{seed}/{index}")
    shard_rng = random.Random(f"p2pgen-chaos/{seed}/{index}/sharded")
    kinds = list(KINDS)
    weights = [KINDS[k][0] for k in kinds]
    out: list[Injection] = []
    left = False
    for i in range(n):
        kind = rng.choices(kinds, weights)[0]
        while kind == "leave" and left:
            kind = rng.choices(kinds, weights)[0]
        if sharded and i % 2 == 1:          # every other fault is one during repartition
            kind = shard_rng.choices(list(SHARD_KINDS), [w for w, _ in SHARD_KINDS.values()])[0]
        left = left or kind == "leave"
        point = rng.choice({**KINDS, **SHARD_KINDS}[kind][1])
        base = 4 + SPACING * i + rng.randint(0, 2)
        # a transition point is reached only during a generation change: aim it at the previous fault's
        transition = point in TRANSITION_POINTS + SHARD_POINTS
        revision = max(1, base - SPACING + 1) if transition and i else base
        peer = ANY_PEER if kind == "kill_shard_source" else f"p{rng.randrange(MEMBERS)}"
        heal = random.Random(f"p2pgen-chaos/{seed}/{index}/heal/{i}").uniform(*HEAL_S) if kind in PARTITIONS else 0.0
        out.append(Injection(kind, point, peer, revision, frame=rng.randrange(2 * MEMBERS - 2), heal_s=round(heal, 2)))
    return Schedule(seed, index, MEMBERS, 8 + SPACING * n, tuple(out))
