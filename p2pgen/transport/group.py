"""The member set a communicator serves: plain values taken from a generation certificate.

Invariant: a Group names exactly one (job, generation) and lists each (peer_id, incarnation) once, in rank
order; rank numbers are positions in that list and mean nothing outside this generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    peer_id: str
    incarnation: int
    host: str
    port: int

    @property
    def identity(self) -> tuple[str, int]:
        return (self.peer_id, self.incarnation)


@dataclass(frozen=True)
class Group:
    job: str
    generation: int
    members: tuple[Endpoint, ...]
    self_index: int

    def __init__(self, job: str, generation: int, members: Sequence[Endpoint], self_index: int) -> None:
        object.__setattr__(self, "job", job)
        object.__setattr__(self, "generation", generation)
        object.__setattr__(self, "members", tuple(members))
        object.__setattr__(self, "self_index", self_index)
        self._validate()

    def _validate(self) -> None:
        if not self.job:
            raise ValueError("Group.job is empty: pass the job name from the certificate")
        if self.generation < 0:
            raise ValueError(f"Group.generation must be >= 0, got {self.generation}")
        if not self.members:
            raise ValueError("Group.members is empty: a generation has at least one member")
        if not 0 <= self.self_index < len(self.members):
            raise ValueError(f"self_index={self.self_index} is outside 0..{len(self.members) - 1}")
        ids = [m.peer_id for m in self.members]
        dup = {p for p in ids if ids.count(p) > 1}
        if dup:
            raise ValueError(f"peer_id(s) {sorted(dup)} appear twice in the member list: one incarnation per peer")

    @property
    def world(self) -> int:
        return len(self.members)

    @property
    def rank(self) -> int:
        return self.self_index

    @property
    def me(self) -> Endpoint:
        return self.members[self.self_index]

    def rank_of(self, peer_id: str) -> int | None:
        for i, m in enumerate(self.members):
            if m.peer_id == peer_id:
                return i
        return None
