"""KV-cache transfer between a prefill peer and a decode peer, exactly once across a decode crash.

The prefill peer streams KV blocks over a p2pgen channel. The decode peer *attaches* each block: it
writes the block into its KV pool (a file-backed array that outlives the process, as a pooled KV store
does), then calls `msg.consumed()`, which appends the block's number to the channel's consumption log.
A block counts as attached once its number is in the log; a block written to the pool but not yet logged
when the process dies is simply written again.

This script is the agent of both peers: it starts them, SIGKILLs the decode peer mid-stream, restarts it
as a new incarnation, and tells the prefill peer about the new generation. The prefill peer's channel asks
the decode peer's log which blocks were consumed and resends exactly the others. At the end the script
checks that every block was attached exactly once and that the pool holds every block's exact bytes.

    python examples/kv_transfer.py                  # 96 blocks, decode killed after 30
    python examples/kv_transfer.py --blocks 200 --kill-after 120
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from p2pgen.channel import Channel, ChannelListener, Endpoint, channel_path, scan

JOB = "kv-transfer"
BLOCK_SHAPE = (2, 8, 16, 64)       # (k|v, heads, tokens per block, head dim): 32 KiB of float16


def kv_block(i: int) -> np.ndarray:
    """The KV block number `i` that prefill computes (deterministic, so the check can recompute it)."""
    return np.random.default_rng(i).standard_normal(BLOCK_SHAPE).astype(np.float16)


def open_pool(path: str, blocks: int, create: bool = False) -> np.ndarray:
    return np.memmap(path, dtype=np.float16, mode="w+" if create else "r+", shape=(blocks, *BLOCK_SHAPE))


# ---- the two peers ----------------------------------------------------------------------------
def decode(args: argparse.Namespace) -> int:
    listener = ChannelListener(JOB, _secret(args), ("decode", args.incarnation), args.log_dir, port=args.port)
    rx = listener.receiver("prefill")
    pool = open_pool(args.pool, args.blocks)
    w, above = rx.consumed_numbers()
    print(f"decode incarnation {args.incarnation}: {w + len(above)} blocks already attached", flush=True)
    print("ready", flush=True)
    while rx.consumed_numbers() != (args.blocks, []):
        msg = rx.receive()
        pool[msg.seq] = msg.array()            # attach: the block's bytes go into the KV pool ...
        pool.flush()
        time.sleep(0.005)                      # ... (decode work) ...
        msg.consumed()                         # ... and only now does it count as attached
        print("attached", msg.seq, flush=True)
    listener.close()
    return 0


def prefill(args: argparse.Namespace) -> int:
    ch = Channel(JOB, _secret(args), ("prefill", 1), Endpoint("decode", 1, "127.0.0.1", args.port))
    threading.Thread(target=follow_agent, args=(ch,), daemon=True).start()
    start = ch.resume_seq
    print(f"prefill: decode has consumed every block below {start}", flush=True)
    for i in range(start, args.blocks):
        ch.send(kv_block(i))               # blocks while the window is full or the channel recovers
    flushed = ch.flush(timeout=60)
    print("prefill stats", ch.stats(), "flushed" if flushed else "NOT flushed", flush=True)
    ch.close()
    return 0 if flushed else 1


def follow_agent(ch: Channel) -> None:
    """What the peer's step loop does: on each new generation, move the channel to it."""
    for line in sys.stdin:                 # "gen <generation> <decode incarnation> <decode port>"
        g, inc, port = map(int, line.split()[1:])
        ch.on_generation(g, Endpoint("decode", inc, "127.0.0.1", port))
        print(f"prefill: generation {g}, decode incarnation {inc}: resent the blocks its log lacks",
              flush=True)


def _secret(args: argparse.Namespace) -> bytes:
    with open(args.secret_file, "rb") as f:
        return f.read().strip()


# ---- the agent --------------------------------------------------------------------------------
def spawn(role: str, args: argparse.Namespace, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--blocks", str(args.blocks),
           "--secret-file", args.secret_file, "--log-dir", args.log_dir, "--pool", args.pool,
           "--port", str(args.port), *extra]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)


def wait_line(proc: subprocess.Popen, prefix: str, echo: bool = True) -> str:
    for line in proc.stdout:
        if echo and not line.startswith("attached"):
            print("  " + line.rstrip())
        if line.startswith(prefix):
            return line
    raise RuntimeError(f"process {proc.pid} exited ({proc.wait()}) before printing {prefix!r}")


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="kv-transfer-") as work:
        args.secret_file, args.log_dir = os.path.join(work, "secret"), os.path.join(work, "logs")
        args.pool = os.path.join(work, "kv_pool.bin")
        with open(args.secret_file, "w") as f:
            f.write(os.urandom(32).hex())
        open_pool(args.pool, args.blocks, create=True).flush()
        args.port = args.port or random.randrange(20000, 32000)
        procs: list[subprocess.Popen] = []
        try:
            return _orchestrate(args, procs)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
                p.wait()


def _orchestrate(args: argparse.Namespace, procs: list[subprocess.Popen]) -> int:
    dec = spawn("decode", args, "--incarnation", "1")
    procs.append(dec)
    wait_line(dec, "ready")
    pre = spawn("prefill", args)
    procs.append(pre)
    wait_line(dec, f"attached {args.kill_after}", echo=False)
    os.kill(dec.pid, signal.SIGKILL)                     # the decode peer dies mid-stream
    dec.wait()
    print(f"agent: SIGKILLed decode incarnation 1 after it attached block {args.kill_after}")
    dec = spawn("decode", args, "--incarnation", "2")    # restarted: a new incarnation, same log dir and pool
    procs.append(dec)
    wait_line(dec, "ready")
    pre.stdin.write(f"gen 1 2 {args.port}\n")
    pre.stdin.flush()
    wait_line(pre, "prefill stats")
    pre.wait()
    dec.wait()                                           # exits once every block is attached
    return check(args)


def check(args: argparse.Namespace) -> int:
    state = scan(channel_path(args.log_dir, JOB, "prefill", "decode"))
    attached = len(state.consumed)
    pool = open_pool(args.pool, args.blocks)
    intact = sum(np.array_equal(pool[i], kv_block(i)) for i in range(args.blocks))
    ok = state.consumed.snapshot() == (args.blocks, []) and state.repeats == 0 and intact == args.blocks
    print(f"{attached}/{args.blocks} blocks attached, {state.repeats} attached twice, "
          f"{args.blocks - attached} missing, {intact}/{args.blocks} intact in the KV pool: "
          f"{'exactly once' if ok else 'FAILED'}")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=96)
    p.add_argument("--kill-after", type=int, default=30, help="SIGKILL decode once it attached this block")
    p.add_argument("--port", type=int, default=0, help="decode's channel port (default: random in 20000-31999)")
    p.add_argument("--role", choices=["decode", "prefill"], help=argparse.SUPPRESS)
    p.add_argument("--incarnation", type=int, default=1, help=argparse.SUPPRESS)
    for name in ("--secret-file", "--log-dir", "--pool"):
        p.add_argument(name, help=argparse.SUPPRESS)
    args = p.parse_args()
    if not 0 <= args.kill_after < args.blocks - 1:
        raise SystemExit("--kill-after must be below --blocks - 1, so the kill lands mid-stream")
    if args.role == "decode":
        return decode(args)
    if args.role == "prefill":
        return prefill(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
