"""Shared state and catch-up (docs/design/state.md).

`SharedState` holds the named tensors, small objects and revision a job agrees on, with cached
content digests. Each application runs a `StateServer` on its state address; inside
`server.serving(generation)` (the application quiesced) it answers authenticated members of that
generation. A member told to pull calls `pull_state`, which fetches only the differing tensors, in
verified chunks, from all of its sources in parallel, resumes a dead source's remaining chunks from
the others, and returns only when the state digest equals the frontier digest.

State that outlives its process: `LocalCopy` (a double-buffered copy on the host, kept by the agent
across incarnations), checkpoints (`write_checkpoint`, `list_checkpoints`, `load_checkpoint`), and
`StateKeeper`, which the step loop uses to restore, offer and save both.

Sharded state: `SharedState.shard(...)` declares a `ShardedObject` that each member holds only in part; the
core chooses its owners at every generation change, `pull_shards` copies the shards a member must receive
before the generation activates, and checkpoints hold each shard once (`shardckpt`).
"""

from p2pgen.state.checkpoint import (
    CheckpointError,
    CheckpointInfo,
    list_checkpoints,
    load_checkpoint,
    write_checkpoint,
)
from p2pgen.state.keeper import StateKeeper, StateKeeperConfig
from p2pgen.state.localcopy import LocalCopy, LocalCopyError
from p2pgen.state.pull import PullConfig, PullReport, Source, pull_state
from p2pgen.state.server import ServerConfig, StateServer
from p2pgen.state.sharded import ShardedObject, ShardMismatch
from p2pgen.state.shared import Entry, Manifest, SharedState
from p2pgen.state.wire import DigestMismatch, StateSyncError

__all__ = ["CheckpointError", "CheckpointInfo", "DigestMismatch", "Entry", "LocalCopy", "LocalCopyError", "Manifest",
           "PullConfig", "PullReport", "ServerConfig", "ShardMismatch", "ShardedObject", "SharedState", "Source",
           "StateKeeper", "StateKeeperConfig",
           "StateServer", "StateSyncError", "list_checkpoints", "load_checkpoint", "pull_state", "write_checkpoint"]
