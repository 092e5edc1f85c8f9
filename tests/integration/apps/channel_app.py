"""Two peers under agents: p0 streams numbered messages to p1 over `peer.channel`, one per step; p1
consumes them from `peer.inbox` on a thread and records each consumed number with its incarnation.
p1 kills itself (SIGKILL) once, right after consuming message KILL_AT; its agent restarts it as a new
incarnation, which continues from the consumption log. Both keep stepping (a barrier per step) so
that generations form and move on."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np

import p2pgen

TOTAL, KILL_AT = 40, 15


def receive(peer: p2pgen.Peer, out_path: str, marker: str, done: threading.Event) -> None:
    for msg in peer.inbox("p0"):
        value = int(msg.array()[0])
        with open(out_path, "a") as f:
            f.write(f"{value} {peer.incarnation}\n")
            f.flush()
            os.fsync(f.fileno())
        msg.consumed()
        if value == KILL_AT and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if value == TOTAL - 1:
            done.set()
            return


def main() -> None:
    out_dir = os.environ["CHANNEL_OUT"]
    state = p2pgen.SharedState(tensors={"x": np.zeros(1, np.int64)})
    peer = p2pgen.join(state=state)
    done = threading.Event()
    if peer.peer_id == "p1":
        threading.Thread(target=receive, args=(peer, os.path.join(out_dir, "consumed.txt"),
                                               os.path.join(out_dir, "killed"), done), daemon=True).start()
    sent = 0
    for step in peer.steps():
        with step:
            step.barrier()
            flag = np.array([1 if done.is_set() or (peer.peer_id == "p0" and sent >= TOTAL) else 0], np.int64)
            step.all_reduce(flag, op="min")
            if peer.peer_id == "p0" and sent < TOTAL:
                try:       # never block the step loop on a receiver that is down: retry next step
                    peer.channel("p1").send(np.array([sent], np.int64), timeout=0.2)
                    sent += 1
                except TimeoutError:
                    pass
            step.commit()
            if flag[0] == 1 and step.world == 2:    # both done, decided together
                break
    if peer.peer_id == "p0":
        peer.channel("p1").flush(timeout=30)
    peer.close()


if __name__ == "__main__":
    main()
