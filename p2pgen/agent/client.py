"""AgentClient: what the CLI, tests and applications use to talk to an agent's control API.

Owns: typed wrappers over the authenticated RPC (`show`, `history`, `submit`, `attach`, `standby`, `leave`,
`stalled`;
the step loop long-polls `wait` directly). Holds no state of its own beyond one connection; reconnects on demand.
"""

from __future__ import annotations

from typing import Any

from p2pgen.agent.rpc import RpcClient
from p2pgen.agent.wire import command_to_wire
from p2pgen.core import Command

STANDBY_POLL_S = 30.0           # longest answer of one `standby` long-poll: the standby then asks again


class AgentClient:
    def __init__(self, addr: str, secret: bytes | None, job: str | None = None, timeout: float = 5.0) -> None:
        self.addr, self.secret, self.job, self.timeout = addr, secret, job, timeout
        self._rpc: RpcClient | None = None

    def _call(self, method: str, io_timeout: float | None = None, **params: Any) -> Any:
        if self._rpc is None:
            self._rpc = RpcClient(self.addr, self.secret, timeout=self.timeout, expect_job=self.job)
        self._rpc.settimeout(io_timeout or self.timeout)
        try:
            return self._rpc.call(method, **params)
        except OSError:
            self.close()
            raise

    def show(self) -> dict[str, Any]:
        return self._call("show")

    def history(self) -> list[dict[str, Any]]:
        return self._call("history")

    def wait(self, after_version: int, timeout: float) -> dict[str, Any]:
        """`show` once the agent applied a Raft entry past `after_version`, or after `timeout` seconds."""
        return self._call("wait", io_timeout=timeout + self.timeout, after_version=after_version, timeout=timeout)

    def submit(self, command: Command) -> dict[str, Any]:
        """Submit a core command through this agent; returns {"ok": bool, "reason": str}."""
        return self._call("submit", io_timeout=self.timeout + 2, command=command_to_wire(command))

    def standby(self, token: str) -> dict[str, Any]:
        """A warm standby's long-poll: {"incarnation": N} once its agent promoted it, None after STANDBY_POLL_S."""
        return self._call("standby", io_timeout=STANDBY_POLL_S + self.timeout, token=token, timeout=STANDBY_POLL_S)

    def attach(self, incarnation: int) -> dict[str, Any]:
        return self._call("attach", incarnation=incarnation)

    def leave(self) -> None:
        self._call("leave")

    def stalled(self, incarnation: int, generation: int, seconds: float) -> list[str]:
        """Tell the agent this member's collective in `generation` has received nothing for `seconds`; returns
        the agents it now judges from the stalled floor (empty when `generation` is not the active one)."""
        return self._call("stalled", incarnation=incarnation, generation=generation, stalled_s=seconds)["agents"]

    def close(self) -> None:
        if self._rpc is not None:
            self._rpc.close()
            self._rpc = None

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
