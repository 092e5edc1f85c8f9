"""The chaos benchmark's training application: `python -m p2pgen_lab.chaos.app RUN_DIR` under a `p2pgen join` agent.

Runs the exact mini-training of `model.py` under the policy named in RUN_DIR/config.json and logs, as
JSON lines in RUN_DIR/logs/<peer>-<incarnation>.jsonl, everything the checker needs: where its state
came from (`start`), every activation (`activate`), every contribution to a step's collective
(`contribute`, written *before* the collective so that a member killed inside it is still accounted
for), every applied step with its digests before and after (`apply`), every fault it fired (`inject`)
and its final state (`final`). Lines are written unbuffered, so a SIGKILL loses none that was written.
The run ends at a revision the harness writes into RUN_DIR/finish once every replaced or joining peer
is back in the active generation (until then members train past `steps`, so that no fault's
consequences are cut off). That revision is ahead of every member's when written, and members stop on
reaching it: the end is a function of the revision, never of when a member happened to look.

Injection points inside one step of revision r (schedule.STEP_POINTS, in this order):
    before_allreduce -> [all-reduce bucket 0: mid_allreduce after sending frame k] -> between_buckets
    -> [all-reduce bucket 1] -> after_allreduce -> momentum written -> mid_optimizer -> weights written
    -> commit -> after_commit
Mid-collective faults count the frames this member hands to the ring in bucket 0's all-reduce; the
count comes from the data plane's frame hook (`p2pgen.transport.hooks`). Frame k is capped to the
last frame the ring sends at the current world size, so a fault aimed at a 4-member ring still fires when
the world shrank.
Collectives of one generation are identified by (generation, attempt): the members of a generation run
the same collectives in lockstep, so their k-th step attempts in it are one collective.

Sharded variant (config `sharded`, `p2pgen chaos --sharded`, certified only): the state also declares
`model.SHARDED`; after the weights each owner updates the shards it holds (`model.optimizer_shards`), and
`activate`, `apply` and `final` carry the digest of every shard the member exposes (`shards`), with the
indexes the certificate gave it (`assigned`, at activation), for the checker's "mismatched shard version".
Shard pulls use SHARD_CHUNK-byte chunks (so a shard takes several frames) and `kill_shard_source` fires after
the first chunk of a shard arrived. `stale_replica` and `reuse_rank` wipe this peer's local copy (as a lost
host's /dev/shm) and leave the state the next process starts from in RUN_DIR/stale/ or RUN_DIR/reuse/;
`stale_replica` also SIGKILLs the application of the other owner of its first shard (that one keeps its local
copy), so that the stale copy may be the only one offered for a while (`co_owner_killed`).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from p2pgen.agent.client import AgentClient
from p2pgen.agent.faultplan import voter_is_up, voters_outlive
from p2pgen.errors import P2PGenError
from p2pgen.peer import Peer
from p2pgen.state import SharedState, wire
from p2pgen.state.keeper import ENV_LOCAL
from p2pgen.transport import FrameKind, hooks
from p2pgen_lab.chaos import model, policies
from p2pgen_lab.chaos.schedule import ANY_PEER, STALE_BACK, Injection

TWO_AGENTS_GAP_S = 0.2           # kill_two_agents: well inside the detection timeout (1.0 s)
VOTER_REPAIR_WAIT_S = 10.0       # agent kills: longest wait for the voters to be able to lose that agent
SHARD_CHUNK = 32                 # bytes per shard-pull frame here: a 128-byte shard comes in 4 chunks


class EventLog:
    def __init__(self, path: str, peer: str, incarnation: int) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._who = {"peer": peer, "incarnation": incarnation}

    def __call__(self, event: str, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), "event": event, **self._who, **fields}) + "\n"
        os.write(self._fd, line.encode())


class Injector:
    """Fires this peer's scheduled injections at named points, each once per run (an O_EXCL marker)."""

    def __init__(self, run_dir: str, config: dict[str, Any], peer_id: str, log: EventLog) -> None:
        self.run_dir, self.config, self.peer_id, self.log = run_dir, config, peer_id, log
        self.all = [Injection(**i) for i in config["injections"]]
        self.mine = [i for i in self.all if i.peer in (peer_id, ANY_PEER)]
        self.peer: Peer | None = None
        self.frames_armed: tuple[int, int, int] | None = None      # (collective seq, revision, frames at least)
        self.frames_posted = 0                                       # by this member, in the armed collective
        self.committed: collections.deque = collections.deque(maxlen=STALE_BACK + 1)   # stale_replica's copies

    def at(self, point: str, revision: int, **context: Any) -> None:
        for inj in self.mine:
            if inj.point == point and revision >= inj.revision and self._claim(inj):
                self.log("inject", kind=inj.kind, point=point, revision=revision, name=inj.name)
                self._fire(inj, context)

    def arm_frames(self, seq: int, revision: int, rank: int, world: int, shared_memory: bool) -> None:
        """Watch collective `seq` for mid_allreduce. Frame k is capped to one this member surely posts: the
        ring posts 2(world-1) frames; through shared memory rank 0 posts a `go` to each other member and
        every other member one `arrive` per barrier (at least one)."""
        least = (world - 1 if rank == 0 else 1) if shared_memory else 2 * (world - 1)
        self.frames_armed, self.frames_posted = (seq, revision, least), 0

    def on_frame(self, seq: int) -> None:
        """This member posted a frame of collective `seq`."""
        if self.frames_armed is None or seq != self.frames_armed[0]:
            return
        _, revision, least = self.frames_armed
        self.frames_posted += 1
        for inj in self.mine:
            if inj.point == "mid_allreduce" and revision >= inj.revision \
                    and self.frames_posted > min(inj.frame, least - 1) and self._claim(inj):
                self.log("inject", kind=inj.kind, point="mid_allreduce", revision=revision, name=inj.name,
                         frame=self.frames_posted)
                self._fire(inj, {})

    def on_shard_chunk(self, source: str, chunk: int) -> None:
        """A chunk of a shard arrived from `source`: kill_shard_source kills that source after the first."""
        revision = self.peer.state.revision if self.peer else 0
        for inj in self.mine:
            if inj.point == "shard_pull" and chunk == 0 and source and revision >= inj.revision and self._claim(inj):
                self.log("inject", kind=inj.kind, point="shard_pull", revision=revision, name=inj.name,
                         source=source, chunk=chunk)
                self._kill_app_of(source)

    def _claim(self, inj: Injection) -> bool:
        """Once the harness fixed the end of the run (RUN_DIR/finish), no new fault starts."""
        if os.path.exists(os.path.join(self.run_dir, "finish")):
            return False
        try:
            os.close(os.open(os.path.join(self.run_dir, "fired", inj.name), os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False

    def _fire(self, inj: Injection, context: dict[str, Any]) -> None:
        me = os.getpid()
        if inj.kind == "kill_app":
            os.kill(me, signal.SIGKILL)
        elif inj.kind in ("kill_agent", "replace_agent"):
            if self._raft_after_repair(lambda raft: {_own_agent()}) is None:
                return
            if inj.kind == "replace_agent":        # the harness replaces it at the same address within 1 s
                open(os.path.join(self.run_dir, "fast", self.peer_id), "w").close()
            self._kill_own_agent()
        elif inj.kind == "kill_two_agents":
            self._kill_two_agents()
        elif inj.kind == "kill_leader":
            self._kill_leader()
        elif inj.kind in ("pause_short", "pause_long"):
            seconds = self.config[inj.kind]
            subprocess.Popen(["/bin/sh", "-c", f"sleep {seconds}; kill -CONT {me} 2>/dev/null"],
                             start_new_session=True)
            os.kill(me, signal.SIGSTOP)
        elif inj.kind == "kill_source":
            self._kill_app_of(context["sources"][0])
        elif inj.kind == "join":
            open(os.path.join(self.run_dir, "requests", f"join-{inj.name}"), "w").close()
        elif inj.kind in ("partition", "partition_one_way", "partition_majority"):
            self._request_partition(inj)
        elif inj.kind == "leave":
            raise SystemExit(0)
        elif inj.kind == "stale_replica":
            revision, w, m, shards = self.committed[0]
            save_sharded(os.path.join(self.run_dir, "stale", f"{self.peer_id}.npz"), revision, w, m, shards,
                         writer=self.peer_id)
            _wipe_local_copy()
            partner = self._co_owner()
            if partner:
                self.log("co_owner_killed", name=inj.name, co_owner=partner)   # part of this injection
                self._kill_app_of(partner)
            os.kill(me, signal.SIGKILL)
        elif inj.kind == "reuse_rank":
            self._reuse_rank()

    def _co_owner(self) -> str | None:
        """The other owner of this member's first shard in the active certificate (None: none known)."""
        cert = self.peer.certificate if self.peer else None
        if self.peer is None or cert is None:
            return None
        me = f"{self.peer_id}#{self.peer.incarnation}"
        for _, _, owners in cert.ownership:
            others = [o.split("#")[0] for o in owners if o != me]
            if me in owners and others:
                return others[0]
        return None

    def _reuse_rank(self) -> None:
        """Be replaced at this address within 0.2 s with no local copy; the next process of this peer id starts
        from the state the member of the next rank last saved (its shards are another rank's)."""
        if self._raft_after_repair(lambda raft: {_own_agent()}) is None:
            return
        peer = self.peer
        rank = (peer.rank + 1) % peer.world if peer and peer.world else 0
        with open(os.path.join(self.run_dir, "reuse", self.peer_id), "w") as f:
            f.write(str(rank))
        open(os.path.join(self.run_dir, "fast", self.peer_id), "w").close()
        _wipe_local_copy()
        self._kill_own_agent()

    @staticmethod
    def _kill_own_agent() -> None:
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(5)                              # PR_SET_PDEATHSIG kills this process with its agent

    def _agents(self) -> dict[str, int]:
        with open(os.path.join(self.run_dir, "agents.json")) as f:
            return json.load(f)

    def _kill_leader(self) -> None:
        """SIGKILL the Raft leader's agent, under the guard of every agent kill (`_raft_after_repair`)."""
        raft = self._raft_after_repair(lambda raft: {raft.get("leader_agent")})
        if raft is None:
            return
        addr = raft.get("leader_agent")
        pid = self._agents().get(addr) if addr else None
        if pid:
            _kill(pid)
            if pid == os.getppid():
                time.sleep(5)

    def _kill_two_agents(self) -> None:
        """Ours and a second agent, TWO_AGENTS_GAP_S apart: the second one chosen so that a majority of the
        voters stays up (a non-voter when ours votes), under the same guard as every agent kill."""
        raft = self._raft_after_repair(lambda raft: {_own_agent(), self._second_victim(raft) or ""})
        if raft is None:
            return
        other = self._second_victim(raft)
        if other:
            _kill(self._agents()[other])
        time.sleep(TWO_AGENTS_GAP_S)
        self._kill_own_agent()

    def _second_victim(self, raft: dict) -> str | None:
        """The other agent to lose with ours: a non-voter first when ours votes, then by address."""
        mine = _own_agent()
        voters = {v["agent"] for v in raft.get("voters", ())}
        others = sorted((a for a in self._agents() if a != mine), key=lambda a: (mine in voters and a in voters, a))
        return others[0] if others else None

    def _raft_after_repair(self, victims: Callable[[dict], set[str]]) -> dict | None:
        """The guard of every agent kill (the harness's rule: never more than a minority of the voters down):
        this agent's Raft view, asked now, once the voters that are up, less the `victims` agents, are a
        majority of the voters (at once when the view does not say who votes). A voter is up when its agent
        answers, still runs that voter node and is not leaving (`voter_is_up`): the Peer's copy of the view is
        up to a second old and an agent killed, replaced or leaving a moment ago is still heard. Right after
        another voter was lost they may not be a majority (a dead voter not removed yet): wait up to
        VOTER_REPAIR_WAIT_S for the repair; None if it does not come (the kill is then skipped and logged)."""
        deadline = time.monotonic() + VOTER_REPAIR_WAIT_S
        while True:
            raft = self._raft_now()
            if raft is not None and voters_outlive(raft, victims(raft), self._voter_is_up):
                return raft
            if time.monotonic() >= deadline:
                self.log("kill_skipped", reason="the voters could not lose these agents and keep a majority")
                return None
            time.sleep(0.1)

    def _raft_now(self) -> dict | None:
        try:
            return self.peer._agent.show()["raft"] if self.peer else {}
        except (P2PGenError, OSError):
            return None

    def _voter_is_up(self, voter: dict) -> bool:
        """`voter_is_up` on what the voter's agent answers now (no answer: down)."""
        try:
            with AgentClient(voter["agent"], self.peer._secret, job=self.peer.job, timeout=0.5) as client:
                shown = client.show()
        except (P2PGenError, OSError):
            shown = None
        return voter_is_up(voter, shown)

    def _request_partition(self, inj: Injection) -> None:
        """Ask the harness (which knows every address of the run) to cut a minority of one agent off: ours, or
        (partition_majority) the first other one by address."""
        mine = os.environ["P2PGEN_AGENT"]
        others = sorted(a for a in self._agents() if a != mine)
        if inj.kind == "partition_majority" and not others:
            return
        minority = [others[0]] if inj.kind == "partition_majority" else [mine]
        request = {"minority": minority, "one_way": inj.kind == "partition_one_way", "heal_s": inj.heal_s}
        path = os.path.join(self.run_dir, "requests", f"partition-{inj.name}")
        with open(path + ".tmp", "w") as f:
            json.dump(request, f)
        os.replace(path + ".tmp", path)

    def _kill_app_of(self, peer_id: str) -> None:
        try:
            with open(os.path.join(self.run_dir, "pids", peer_id)) as f:
                _kill(int(f.read()))
        except (OSError, ValueError):
            pass


def _own_agent() -> str:
    return os.environ["P2PGEN_AGENT"]


def _wipe_local_copy() -> None:
    """This host lost the local copy (e.g. its /dev/shm): the next process cannot restore it."""
    folder = os.environ.get(ENV_LOCAL, "")
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def save_sharded(path: str, revision: int, w: np.ndarray, m: np.ndarray, shards: dict[int, np.ndarray],
                 **meta: Any) -> None:
    """Atomic: the state and the shards held at one committed revision."""
    tmp = f"{path}.{os.getpid()}.tmp.npz"
    np.savez(tmp, w=w, m=m, revision=revision, **{f"shard_{i}": a for i, a in shards.items()},
             **{k: np.array(v) for k, v in meta.items()})
    os.replace(tmp, path)


def load_sharded(path: str) -> SharedState | None:
    """A SharedState holding exactly the state and shards saved by `save_sharded` (None: no file)."""
    if not os.path.exists(path):
        return None
    with np.load(path) as z:
        state = SharedState(tensors={"w": z["w"].copy(), "m": z["m"].copy()}, revision=int(z["revision"]))
        model.declare_shards(state)
        state.sharded[model.SHARDED].held = {int(k[6:]): z[k].copy() for k in z.files if k.startswith("shard_")}
    return state


def shard_digests(state: SharedState) -> dict[str, dict[str, str]]:
    """object id -> shard index (as text) -> digest, for every shard this member holds."""
    return {o: {str(i): obj.digest(i) for i in obj.owned()} for o, obj in state.sharded.items()}


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def watch_frames(injector: Injector) -> None:
    """Mid-collective and mid-shard-pull faults fire from the data plane's frame hook: after this member posted
    frame k of a collective, and after the first chunk of a shard arrived from its source."""
    def on_frame(event: hooks.FrameEvent) -> None:
        if event.plane == hooks.COLLECTIVE and event.direction == "posted" and event.kind == FrameKind.COLLECTIVE:
            injector.on_frame(event.op_seq)
        elif event.plane == hooks.SHARD and event.kind == wire.CHUNK:
            injector.on_shard_chunk(event.peer[0], event.chunk)
    hooks.add_frame_hook(on_frame)


def sharded_starting_state(run_dir: str, peer_id: str) -> tuple[SharedState, dict[str, Any]]:
    """certified, sharded: a stale copy (stale_replica), another rank's state (reuse_rank) or the initial state
    (the local copy, when there is one, is restored later by the peer if it is newer)."""
    for kind, path in (("stale", os.path.join(run_dir, "stale", f"{peer_id}.npz")),
                       ("other-rank", os.path.join(run_dir, "reuse", peer_id))):
        if not os.path.exists(path):
            continue
        used = f"{path}.used-{os.getpid()}"
        os.replace(path, used)                                    # one process starts from it, once
        if kind == "other-rank":
            with open(used) as f:
                used = os.path.join(run_dir, "ranks", f"{f.read().strip()}.npz")
        state = load_sharded(used)
        if state is not None:
            return state, {"source": kind, "from": os.path.basename(used)}
    state = SharedState(tensors=model.initial_tensors())
    model.declare_shards(state)
    return state, {"source": "initial"}


def starting_state(policy: str, run_dir: str, peer_id: str,
                   sharded: bool = False) -> tuple[SharedState, dict[str, Any]]:
    """Where this process's state comes from: see `policies`."""
    if sharded:
        return sharded_starting_state(run_dir, peer_id)
    loaded = None
    if policy == "comm-only":
        loaded = policies.load_npz(policies.snapshot_path(run_dir, peer_id))
    elif policy == "restart-all":
        loaded = policies.load_npz(policies.checkpoint_path(run_dir))
    if loaded is None:
        return SharedState(tensors=model.initial_tensors()), {"source": "initial"}
    tensors, revision, meta = loaded
    source = "snapshot" if policy == "comm-only" else "checkpoint"
    return SharedState(tensors=tensors, revision=revision), {"source": source, **meta}


def _takes_shared_memory(backend: Any, nbytes: int) -> bool:
    """Whether the TCP backend under `backend` (the peer wraps it in a HostStagedBackend) all-reduces
    `nbytes` through shared memory now; False for any other backend."""
    takes = getattr(getattr(backend, "inner", backend), "takes_shared_memory", None)
    return bool(takes and takes(nbytes))


def run_step(step: Any, state: SharedState, injector: Injector, log: EventLog, attempt: int) -> None:
    r, peer = step.revision, injector.peer
    lo, hi = model.shard(step.rank, step.world)
    grad = model.gradient(r, lo, hi)
    log("contribute", generation=step.generation, attempt=attempt, rank=step.rank, world=step.world, revision=r,
        lo=lo, hi=hi)
    injector.at("before_allreduce", r)
    for i, bucket in enumerate(model.buckets(grad)):
        if i == 0:
            injector.arm_frames(peer._backend.op_seq + 1, r, step.rank, step.world,   # the control all-reduce is first
                                _takes_shared_memory(peer._backend, bucket.nbytes))
        step.all_reduce(bucket, op="sum")
        injector.frames_armed = None
        if i == 0:
            injector.at("between_buckets", r)
    injector.at("after_allreduce", r)
    before = state.digest()
    model.optimizer_momentum(state.tensors["m"], grad)
    injector.at("mid_optimizer", r)
    model.optimizer_weights(state.tensors["w"], state.tensors["m"])
    shards = {}
    if state.sharded:
        model.optimizer_shards(state.sharded[model.SHARDED], grad)
        shards = {"shards": shard_digests(state)}
    step.commit()
    log("apply", generation=step.generation, attempt=attempt, rank=step.rank, world=step.world, revision=r,
        before=before, after=state.digest(), **shards)


def remember_commit(injector: Injector, state: SharedState, rank: int) -> None:
    """Sharded: keep the last commits for stale_replica, and save this rank's state for reuse_rank."""
    obj = state.sharded[model.SHARDED]
    copy = (state.revision, state.tensors["w"].copy(), state.tensors["m"].copy(),
            {i: a.copy() for i, a in obj.held.items()})
    injector.committed.append(copy)
    if any(i.kind == "reuse_rank" for i in injector.all):
        save_sharded(os.path.join(injector.run_dir, "ranks", f"{rank}.npz"), *copy, writer=injector.peer_id)


def save_after_commit(policy: str, run_dir: str, state: SharedState, peer_id: str, incarnation: int,
                      rank: int) -> None:
    if policy == "comm-only":
        policies.save_npz(policies.snapshot_path(run_dir, peer_id), state, writer=incarnation)
    elif policy == "restart-all" and rank == 0 and state.revision % policies.CHECKPOINT_EVERY == 0:
        policies.save_npz(policies.checkpoint_path(run_dir), state, writer=incarnation)


def end_revision(run_dir: str, steps: int) -> float:
    try:
        with open(os.path.join(run_dir, "finish")) as f:
            return max(steps, int(f.read()))
    except FileNotFoundError:
        return float("inf")


def main(run_dir: str) -> int:
    with open(os.path.join(run_dir, "config.json")) as f:
        config = json.load(f)
    policy, peer_id, incarnation = config["policy"], os.environ["P2PGEN_PEER_ID"], int(os.environ["P2PGEN_INCARNATION"])
    log = EventLog(os.path.join(run_dir, "logs", f"{peer_id}-{incarnation}.jsonl"), peer_id, incarnation)
    with open(os.path.join(run_dir, "pids", peer_id), "w") as f:
        f.write(str(os.getpid()))
    sharded = bool(config.get("sharded"))
    state, origin = starting_state(policy, run_dir, peer_id, sharded)
    log("start", policy=policy, revision=state.revision, digest=state.digest(), **origin,
        **({"shards": shard_digests(state)} if sharded else {}))
    injector = Injector(run_dir, config, peer_id, log)
    watch_frames(injector)
    if sharded:
        injector.committed.append((state.revision, state.tensors["w"].copy(), state.tensors["m"].copy(),
                                   {i: a.copy() for i, a in state.sharded[model.SHARDED].held.items()}))
    peer = policies.join(policy, state, injector.at, log, shard_chunk=SHARD_CHUNK if sharded else None)
    injector.peer = peer
    attempts: dict[int, int] = {}
    try:
        for step in peer.steps():
            if state.revision >= end_revision(run_dir, config["steps"]):
                break
            attempt = attempts[step.generation] = attempts.get(step.generation, -1) + 1
            with step:
                time.sleep(config["step_delay"])
                run_step(step, state, injector, log, attempt)
            if step.committed:
                save_after_commit(policy, run_dir, state, peer_id, incarnation, step.rank)
                if sharded:
                    remember_commit(injector, state, step.rank)
                injector.at("after_commit", state.revision - 1)
        log("final", revision=state.revision, digest=state.digest(),
            **({"shards": shard_digests(state)} if sharded else {}))
    except SystemExit:
        log("left", revision=state.revision, digest=state.digest())
    peer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
