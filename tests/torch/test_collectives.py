"""torch.distributed collective checks against the p2pgen backend.

Three member processes each run tests/torch/dist_checks.py's CHECKS through the public
torch.distributed API on the `p2pgen` group; each check is one test here, passing only when it passed
on every member. The processes are spawned once per module and killed by pid when it ends.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest

from p2pgen.transport import Endpoint
from tests.torch import dist_checks

pytestmark = pytest.mark.timeout(300)

WORLD = 3
RESULT_TIMEOUT_S = 150.0     # generous: importing torch.distributed.tensor (first DDP) is slow on loaded cores


@pytest.fixture(scope="module")
def results() -> dict[str, list[str]]:
    """{check name: [outcome on rank 0, 1, 2]} ("ok" or a traceback)."""
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    try:
        for rank in range(WORLD):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=dist_checks.member_main, args=(child, rank), daemon=True)
            proc.start()
            pipes.append(parent)
            procs.append(proc)
        ports = [_receive(pipe) for pipe in pipes]
        endpoints = [Endpoint(f"peer{r}", 100 + r, "127.0.0.1", ports[r]) for r in range(WORLD)]
        for pipe in pipes:
            pipe.send(endpoints)
        outcomes: dict[str, list[str]] = {c.__name__: [] for c in dist_checks.CHECKS}
        for _ in dist_checks.CHECKS:
            for pipe in pipes:
                name, outcome = _receive(pipe)
                outcomes[name].append(outcome)
        yield outcomes
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(10)


def _receive(pipe):
    assert pipe.poll(RESULT_TIMEOUT_S), f"no report within {RESULT_TIMEOUT_S} s: a member hangs"
    return pipe.recv()


@pytest.mark.parametrize("check", [c.__name__ for c in dist_checks.CHECKS])
def test_check_passes_on_every_member(results, check):
    failures = [f"rank {r}:\n{o}" for r, o in enumerate(results[check]) if o != "ok"]
    assert not failures, "\n".join(failures)
