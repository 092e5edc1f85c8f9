"""The lab's seeded fault plans replay exactly what they drew before the planner's rules moved to the runtime
(`p2pgen.agent.faultplan`): the stress plan's actions over a spread of worlds, and chaos's schedules, as digests.
A change here changes which faults a seed injects, and so the verdicts recorded for it."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

import pytest

from p2pgen_lab.chaos import schedule
from p2pgen_lab.stress import plan

pytestmark = pytest.mark.timeout(60)

STRESS_DIGEST = "e1f2ae2ee1812df085df68dbdf0f54c014adc633c4ae2d5671f3cf679f08a7e9"
CHAOS_DIGEST = "04d9686143d6b7db29ba9429453eef289dcb94229555c3bfb83939dc6f4042f4"


def _worlds(seed: int) -> Iterator[plan.World]:
    r = random.Random(seed)
    for _ in range(60):
        n = r.randint(1, 8)
        agents = tuple(plan.Agent(f"p{i}", r.random() < 0.8, r.random() < 0.7, r.random() < 0.8) for i in range(n))
        voters = sum(a.voter for a in agents) or 1
        yield plan.World(agents, voters, r.randint(0, voters), n + r.randint(0, 2), r.randint(1, 4),
                         can_join=r.random() < 0.8, can_partition=r.random() < 0.7, hosts=r.random() < 0.3)


def test_the_stress_plan_draws_what_it_drew() -> None:
    h = hashlib.sha256()
    for seed in range(300):
        rng = random.Random(f"p2pgen-stress/{seed}")
        kinds = () if seed % 3 else tuple(sorted(random.Random(seed).sample(list(plan.KINDS), 3)))
        for w in _worlds(seed):
            a = plan.choose(rng, w, new_peer=f"p{len(w.agents)}", kinds=kinds)
            h.update(repr((a, plan.next_delay(rng), plan.quorum_safe(w, list(w.up[:2])))).encode())
    assert h.hexdigest() == STRESS_DIGEST


def test_the_chaos_schedules_are_what_they_were() -> None:
    h = hashlib.sha256()
    for seed in range(300):
        for sharded in (False, True):
            h.update(repr([s.to_json() for s in schedule.generate(seed, 4, 4 + seed % 3, sharded)]).encode())
    h.update(repr([s.to_json() for s in schedule.smoke() + schedule.smoke_sharded()]).encode())
    assert h.hexdigest() == CHAOS_DIGEST
