"""Shared state and catch-up (DESIGN.md, "State sync").

`SharedState` holds the named tensors, small objects and revision a job agrees on, with cached
content digests. Each application runs a `StateServer` on its state address; inside
`server.serving(generation)` (the application quiesced) it answers authenticated members of that
generation. A member told to pull calls `pull_state`, which fetches only the differing tensors, in
verified chunks, from all of its sources in parallel, resumes a dead source's remaining chunks from
the others, and returns only when the state digest equals the frontier digest.
"""

from p2pgen.state.pull import PullConfig, PullReport, Source, pull_state
from p2pgen.state.server import ServerConfig, StateServer
from p2pgen.state.shared import Entry, Manifest, SharedState
from p2pgen.state.wire import DigestMismatch, StateSyncError

__all__ = ["DigestMismatch", "Entry", "Manifest", "PullConfig", "PullReport", "ServerConfig", "SharedState",
           "Source", "StateServer", "StateSyncError", "pull_state"]
