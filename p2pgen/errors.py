"""Exceptions that p2pgen raises to users. Each message says what was wrong and what to do."""

from __future__ import annotations


class P2PGenError(Exception):
    """Base class of every p2pgen error."""


class AuthenticationError(P2PGenError):
    """The other side did not prove knowledge of the job secret (I8)."""


class ProtocolError(P2PGenError):
    """A malformed, oversized or unexpected message arrived; the connection that sent it is closed."""


class EncryptionMismatch(ProtocolError):
    """A handshake between a member with `--encrypt` and one without: the message names the one to restart."""


class GenerationChanged(P2PGenError):
    """The generation this operation belonged to was retired; retry the step in the new generation."""


class PeerLost(P2PGenError):
    """A member of the current generation stopped answering during an operation."""


class Evicted(P2PGenError):
    """This incarnation was removed from the job; it must restart as a new incarnation."""


class AgentLost(P2PGenError):
    """This process lost its local agent (it died or stopped answering): it can no longer know its generation
    and must exit; a live agent restarts it as a new incarnation."""


class BarrierTimeout(PeerLost, RuntimeError):
    """A monitored barrier's rank 0 did not see every member arrive in time; the generation is retired. It is a
    RuntimeError too, as torch's gloo raises one."""
