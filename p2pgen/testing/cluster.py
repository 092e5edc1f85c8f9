"""Test double: N data-plane members in one process, each on its own thread, on real loopback sockets.

`LocalCluster(world)` opens one Transport per member; `backends(generation)` gives each member a
TcpBackend for that generation; `run(fn, backends)` calls fn(backend) on every member concurrently and
returns the results in rank order, or raises the first member's error (aborting the others, so no
thread is left blocked).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from p2pgen.collectives import TcpBackend
from p2pgen.testing.ports import open_transport
from p2pgen.transport import Group, Transport, TransportConfig

SECRET = b"p2pgen-test-secret-0123456789abcdef"


class LocalCluster:
    def __init__(self, world: int, job: str = "test-job", secret: bytes = SECRET,
                 config: TransportConfig | None = None) -> None:
        self.job = job
        self.transports: list[Transport] = []
        try:
            for i in range(world):
                self.transports.append(open_transport(job, secret, f"peer{i}", 1000 + i, config))
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def groups(self, generation: int) -> list[Group]:
        members = [t.endpoint() for t in self.transports]
        return [Group(self.job, generation, members, i) for i in range(len(members))]

    def backends(self, generation: int) -> list[TcpBackend]:
        return [TcpBackend(t, g) for t, g in zip(self.transports, self.groups(generation))]

    def run(self, fn: Callable[[Any], Any], backends: Sequence[Any], timeout: float = 60.0) -> list[Any]:
        results: list[Any] = [None] * len(backends)
        errors: list[BaseException | None] = [None] * len(backends)

        def body(i: int) -> None:
            try:
                results[i] = fn(backends[i])
            except BaseException as e:   # reported to the caller below
                errors[i] = e

        threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(backends))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        if any(t.is_alive() for t in threads):
            for b in backends:
                b.abort("LocalCluster.run timed out")
            raise TimeoutError(f"members still running after {timeout}s (aborted them)")
        for e in errors:
            if e is not None:
                raise e
        return results

    def stats(self) -> list[dict[str, int]]:
        return [t.stats() for t in self.transports]

    def close(self) -> None:
        for t in self.transports:
            t.close()
