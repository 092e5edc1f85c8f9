"""`--encrypt` from the command line to the application: refused without a real secret or with a backend it cannot
seal, handed to the application as $P2PGEN_ENCRYPT, and (slow) a whole `join --local 2 --encrypt` run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from p2pgen import cli
from p2pgen.agent.agent import Agent, AgentConfig
from p2pgen.errors import P2PGenError
from p2pgen.peer import Peer, join
from p2pgen.state import SharedState
from p2pgen.transport import seal
from p2pgen_lab.rigs.agents import free_local_base

ROOT = Path(__file__).resolve().parents[2]
EXACT_APP = str(ROOT / "tests" / "integration" / "apps" / "exact_train.py")

pytestmark = pytest.mark.timeout(30)


def test_join_encrypt_without_a_secret_file_is_refused(capsys, monkeypatch):
    monkeypatch.delenv("P2PGEN_SECRET_FILE", raising=False)
    assert cli.main(["join", "--id", "p0", "--listen", "127.0.0.1:20500", "--encrypt"]) == 2
    assert "--encrypt needs a real job secret" in capsys.readouterr().err


def test_a_bad_p2pgen_encrypt_value_is_explained(capsys, monkeypatch):
    monkeypatch.setenv(seal.ENV, "yes")
    assert cli.main(["join", "--local", "2", "--base-port", "20500"]) == 2
    assert "P2PGEN_ENCRYPT='yes': use 1" in capsys.readouterr().err


@pytest.mark.parametrize("encrypt, value", [(True, "1"), (False, None)])
def test_the_agent_hands_the_setting_to_its_application(encrypt, value, tmp_path):
    config = AgentConfig(job="j", peer_id="p0", listen="127.0.0.1:20500", secret=b"s", encrypt=encrypt,
                         channel_dir=str(tmp_path))
    agent = Agent.__new__(Agent)           # only the environment is under test: no sockets, no Raft
    agent.config, agent.addr = config, config.listen
    assert agent._app_env(3)[seal.ENV] == value


def test_an_application_asked_to_encrypt_needs_the_secret_file(monkeypatch):
    for name, value in {"P2PGEN_AGENT": "127.0.0.1:1", "P2PGEN_PEER_ID": "p0", "P2PGEN_INCARNATION": "1",
                        "P2PGEN_DATA_ADDR": "127.0.0.1:0", "P2PGEN_STATE_ADDR": "127.0.0.1:0", seal.ENV: "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("P2PGEN_SECRET_FILE", raising=False)
    with pytest.raises(P2PGenError, match="needs a real job secret"):
        join("demo")


def test_encrypt_with_the_nccl_backend_is_refused_before_anything_starts():
    with pytest.raises(P2PGenError, match="cross the network unencrypted"):
        Peer("j", SharedState(), "127.0.0.1:1", "p0", 1, b"secret", "127.0.0.1:0", "127.0.0.1:0", backend="nccl",
             encrypt=True)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_join_local_encrypt_trains_to_identical_states(tmp_path):
    env = {**os.environ, "EXACT_STEPS": "20", "EXACT_STEP_DELAY": "0.02"}
    cmd = [sys.executable, "-m", "p2pgen", "join", "--local", "2", "--base-port", str(free_local_base(2)),
           "--job", "local-encrypt", "--encrypt", "--", sys.executable, EXACT_APP]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=170)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "final state: identical on every member" in done.stdout, output
    assert "encryption_mismatch" not in output and "bad_seal" not in output, output
