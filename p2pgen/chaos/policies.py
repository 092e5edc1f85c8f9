"""The three recovery policies, as variants of `p2pgen.peer.Peer` running the same application code.

- `certified` (p2pgen): the normal step loop. Between generations every member votes `ready` with its
  revision and digest, the frontier is elected, members behind it pull, and only then is the next
  generation activated (I4). A restarted process resumes from its host's local copy of its peer's last
  committed state when it verifies (else from the initial state) and catches up.
- `comm-only`: a new communicator per membership change and nothing else. Each member votes `ready`
  with revision 0 and no digest, so the election never orders a pull, and it continues from whatever it
  holds locally. A restarted process resumes from the snapshot its peer id last wrote (its predecessor
  incarnation's local state, as a process reloading its own local checkpoint would); a new peer starts
  from the initial state. This is raw communicator shrink/grow: liveness without a frontier.
- `restart-all` (torchrun): on any membership change every application exits and its agent restarts
  it; every new process loads the last checkpoint (written by rank 0 every CHECKPOINT_EVERY commits).
  Like torchrun's rendezvous, a new process votes only once every live agent's process registered (or
  after RENDEZVOUS_S), so one restart wave forms one generation instead of triggering the next wave.
  Correct by construction, at the price of rolling back to the checkpoint.
Each variant also calls the application's injection hooks at the transition points (`pending`,
`catch_up`) and records every activation, so the checker can follow state across generations.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np

from p2pgen.auth import load_secret
from p2pgen.core import Ready
from p2pgen.peer import Peer
from p2pgen.state import SharedState, StateKeeperConfig

POLICIES = ("certified", "comm-only", "restart-all")
CHECKPOINT_EVERY = 5
RESTART_ALL_EXIT = 75
RENDEZVOUS_S = 5.0

Hook = Callable[..., None]
Record = Callable[..., None]


class ChaosPeer(Peer):
    """`certified`: the p2pgen step loop, plus the transition-point hooks and activation records."""

    hook: Hook          # set by `join` before the first generation
    record: Record

    def _vote_ready(self, pending: dict[str, Any], quiescence: str, seq: int) -> bool:
        voted = super()._vote_ready(pending, quiescence, seq)
        if voted:
            self.hook("pending", self.state.revision)
        return voted

    def _sync_if_told(self, pending: dict[str, Any], state: dict[str, Any]) -> bool:
        pull = next((p for p in pending["pulls"] if p["peer_id"] == self.peer_id), None)
        if pull is not None:
            self.hook("catch_up", self.state.revision, sources=list(pull["sources"]))
        return super()._sync_if_told(pending, state)

    def _activate(self, cert: dict[str, Any]) -> None:
        super()._activate(cert)
        self.record("activate", generation=cert["generation"], rank=self.rank, world=self.world,
                    revision=self.state.revision, digest=self.state.digest(),
                    members=[[m["peer_id"], m["incarnation"]] for m in cert["members"]], **self._shard_fields(cert))

    def _shard_fields(self, cert: dict[str, Any]) -> dict[str, Any]:
        """Sharded jobs: the digest of every shard this member exposes now, and the shards the certificate gave it."""
        if not self.state.sharded:
            return {}
        me = f"{self.peer_id}#{self.incarnation}"
        assigned: dict[str, list[int]] = {o: [] for o in self.state.sharded}
        for entry in cert.get("ownership", []):
            if me in entry["owners"]:
                assigned.setdefault(entry["object_id"], []).append(entry["shard"])
        shards = {o: {str(i): obj.digest(i) for i in obj.owned()} for o, obj in self.state.sharded.items()}
        return {"shards": shards, "assigned": assigned,
                "ownership": [[e["object_id"], e["shard"], e["owners"]] for e in cert.get("ownership", [])]}


class CommOnlyPeer(ChaosPeer):
    """`comm-only`: votes ready with no state, so nobody is ever told to pull; keeps its local state."""

    def _vote_ready(self, pending: dict[str, Any], quiescence: str, seq: int) -> bool:
        outcome = self._submit(Ready(pending["generation"], self.peer_id, self.incarnation, quiescence, 0, "", seq,
                                     at=time.time()))
        if outcome is None:
            return False
        self.trace.record("ready", generation=pending["generation"], revision=0, digest="", ok=outcome["ok"],
                          reason=outcome["reason"], quiescence=quiescence)
        self.hook("pending", self.state.revision)
        return True


class RestartAllPeer(ChaosPeer):
    """`restart-all`: the first generation change after this process was active ends the process."""

    def _enter_next_generation(self) -> None:
        if self.backend is not None:
            self.record("restart_all", generation=self.backend.generation, revision=self.state.revision)
            os._exit(RESTART_ALL_EXIT)
        super()._enter_next_generation()

    def _vote_ready(self, pending: dict[str, Any], quiescence: str, seq: int) -> bool:
        """Rendezvous: vote once the proposal holds a process of every live agent."""
        deadline = time.monotonic() + RENDEZVOUS_S
        while time.monotonic() < deadline:
            view = self._wait_view(0.1)
            latest = view["state"]["pending"]
            if latest is None or latest["generation"] != pending["generation"]:
                return False                       # superseded: the step loop votes for the newer proposal
            if len(latest["members"]) >= len(view["raft"]["agents"]):
                break
        return super()._vote_ready(pending, quiescence, seq)



PEER_CLASSES: dict[str, type[ChaosPeer]] = {"certified": ChaosPeer, "comm-only": CommOnlyPeer,
                                            "restart-all": RestartAllPeer}


def join(policy: str, state: SharedState, hook: Hook, record: Record) -> ChaosPeer:
    """`p2pgen.join()` for one policy's Peer class (reads the environment the agent set)."""
    env = os.environ
    peer = PEER_CLASSES[policy](env["P2PGEN_JOB"], state, env["P2PGEN_AGENT"], env["P2PGEN_PEER_ID"],
                                int(env["P2PGEN_INCARNATION"]),
                                load_secret(env.get("P2PGEN_SECRET_FILE"), env["P2PGEN_JOB"]),
                                env["P2PGEN_DATA_ADDR"], env["P2PGEN_STATE_ADDR"],
                                keep=StateKeeperConfig.from_env(env) if policy == "certified" else None)
    peer.hook, peer.record = hook, record         # before the first generation: steps() activates it
    return peer


# --- where each policy's process starts from, and what it saves ------------------------------------------

def save_npz(path: str, state: SharedState, **meta: Any) -> None:
    """Atomic: a reader sees the old file or the new one, never half of one."""
    tmp = f"{path}.{os.getpid()}.tmp.npz"
    np.savez(tmp, w=state.tensors["w"], m=state.tensors["m"], revision=state.revision,
             **{k: np.array(v) for k, v in meta.items()})
    os.replace(tmp, path)


def load_npz(path: str) -> tuple[dict[str, np.ndarray], int, dict[str, Any]] | None:
    if not os.path.exists(path):
        return None
    with np.load(path) as z:
        meta = {k: z[k].item() for k in z.files if k not in ("w", "m", "revision")}
        return {"w": z["w"].copy(), "m": z["m"].copy()}, int(z["revision"]), meta


def snapshot_path(run_dir: str, peer_id: str) -> str:
    return os.path.join(run_dir, "snapshots", f"{peer_id}.npz")


def checkpoint_path(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoint.npz")
