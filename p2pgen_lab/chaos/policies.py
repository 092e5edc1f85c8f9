"""The three recovery policies, as parameters of the one follower (`p2pgen.core.follower`) running the same
application code.

- `certified` (p2pgen): the normal step loop. Between generations every member votes `ready` with its
  revision and digest, the frontier is elected, members behind it pull, and only then is the next
  generation activated (I4). A restarted process resumes from its host's local copy of its peer's last
  committed state when it verifies (else from the initial state) and catches up.
- `comm-only`: a new communicator per membership change and nothing else. Each member votes `ready`
  with revision 0 and no digest (`FollowerPolicy.report_state=False`), so the election never orders a pull,
  and it continues from whatever it holds locally. A restarted process resumes from the snapshot its peer id
  last wrote (its predecessor incarnation's local state, as a process reloading its own local checkpoint
  would); a new peer starts from the initial state. This is raw communicator shrink/grow: liveness without a
  frontier.
- `restart-all` (torchrun): on any membership change every application exits (`restart_on_change`) and its
  agent restarts it; every new process loads the last checkpoint (written by rank 0 every CHECKPOINT_EVERY
  commits). Like torchrun's rendezvous, a new process votes only once every live agent's process registered
  and a short last call is over (or after RENDEZVOUS_S: `rendezvous_s`, `last_call_s`), so one restart wave
  forms one generation instead of triggering the next wave. RENDEZVOUS_S outlasts an agent's bounded wait
  before it relaunches a dead application (5 s): at 5 s the two waits raced, and two groups of processes could
  keep restarting each other, each forming a generation without the other. Correct by construction, at the
  price of rolling back to the checkpoint.
`ChaosObserver` calls the application's injection hooks at the transition points (`pending` after a vote,
`catch_up` before a pull) and records every activation and every restart-all exit, so the checker can follow
state across generations.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from p2pgen.auth import load_secret
from p2pgen.core.follower import CERTIFIED, Action, Activate, Exit, Fetch, FollowerPolicy, Vote
from p2pgen.peer import Peer, PeerObserver
from p2pgen.state import SharedState, StateKeeperConfig
from p2pgen.state.pull import PullConfig

CHECKPOINT_EVERY = 5
RESTART_ALL_EXIT = 75
RENDEZVOUS_S = 10.0              # longer than an agent's bounded relaunch wait (retire_wait, 5 s) plus a start
LAST_CALL_S = 0.2                # the rendezvous waits at least this long for the views to count every agent
POLICIES: dict[str, FollowerPolicy] = {
    "certified": CERTIFIED,
    "comm-only": FollowerPolicy(report_state=False),
    "restart-all": FollowerPolicy(restart_on_change=True, rendezvous_s=RENDEZVOUS_S, last_call_s=LAST_CALL_S),
}

Hook = Callable[..., None]
Record = Callable[..., None]


class ChaosObserver(PeerObserver):
    """The transition-point hooks and the records the checker reads, for every policy."""

    def __init__(self, hook: Hook, record: Record) -> None:
        self.hook, self.record = hook, record

    def before(self, peer: Peer, action: Action) -> None:
        if isinstance(action, Fetch):
            self.hook("catch_up", peer.state.revision, sources=list(action.pull.sources))
        elif isinstance(action, Exit) and peer._follower.policy.restart_on_change and peer._backend is not None:
            self.record("restart_all", generation=peer._backend.generation, revision=peer.state.revision)
            os._exit(RESTART_ALL_EXIT)

    def after(self, peer: Peer, action: Action, ok: bool | None) -> None:
        if isinstance(action, Vote) and ok is not None:
            self.hook("pending", peer.state.revision)
        elif isinstance(action, Activate):
            cert = action.active
            self.record("activate", generation=cert.generation, rank=peer.rank, world=peer.world,
                        revision=peer.state.revision, digest=peer.state.digest(),
                        members=[[m.peer_id, m.incarnation] for m in cert.members], **shard_fields(peer))


def shard_fields(peer: Peer) -> dict[str, Any]:
    """Sharded jobs: the digest of every shard this member exposes now, and the shards the certificate gave it."""
    cert = peer.certificate
    if not peer.state.sharded or cert is None:
        return {}
    assigned: dict[str, list[int]] = {o: [] for o in peer.state.sharded}
    assigned.update(cert.shards_owned(peer._identity))
    shards = {o: {str(i): obj.digest(i) for i in obj.owned()} for o, obj in peer.state.sharded.items()}
    return {"shards": shards, "assigned": assigned,
            "ownership": [[o, i, list(w)] for o, i, w in cert.ownership]}


def join(policy: str, state: SharedState, hook: Hook, record: Record, shard_chunk: int | None = None) -> Peer:
    """`p2pgen.join()` for one policy (reads the environment the agent set). `shard_chunk`: bytes per shard-pull
    frame (small, so that a fault can fire between the chunks of one shard)."""
    env = os.environ
    return Peer(env["P2PGEN_JOB"], state, env["P2PGEN_AGENT"], env["P2PGEN_PEER_ID"], int(env["P2PGEN_INCARNATION"]),
                load_secret(env.get("P2PGEN_SECRET_FILE"), env["P2PGEN_JOB"]), env["P2PGEN_DATA_ADDR"],
                env["P2PGEN_STATE_ADDR"], keep=StateKeeperConfig.from_env(env) if policy == "certified" else None,
                policy=POLICIES[policy], observer=ChaosObserver(hook, record),
                shard_pull_config=PullConfig(chunk_bytes=shard_chunk) if shard_chunk else PullConfig())


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
