"""The agent driver's decisions (p2pgen.core.agentmachine), pinned by transcripts on the real machine.

Transcripts: tests/core/testdata/agent/*.txt (format: tests/core/agent_transcript.py); each one simulates one
agent (its application, standby, Raft node and heartbeats) beside the other members' commands.
`P2PGEN_REWRITE=1 pytest tests/core/test_agentmachine.py` rewrites the expected output; only commit what you
understand.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agent_transcript import format_transcript, run_agent_transcript

TESTDATA = Path(__file__).parent / "testdata" / "agent"
FILES = sorted(TESTDATA.glob("*.txt"))
REWRITE = os.environ.get("P2PGEN_REWRITE") == "1"


def test_agent_testdata_present():
    assert len(FILES) >= 6, f"expected the agent transcripts under {TESTDATA}"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_agent_transcript(path: Path):
    text = path.read_text()
    directives, outputs, trailing, _ = run_agent_transcript(text)
    errors = [f"{d.line!r} (line {d.lineno}): {line}" for d, out in zip(directives, outputs)
              for line in out if line.startswith("ERROR")]
    assert not errors, "\n".join(errors)
    actual = format_transcript(directives, outputs, trailing)
    if REWRITE:
        if actual != text:
            path.write_text(actual)
        return
    assert actual == text, f"{path.name}: output differs (P2PGEN_REWRITE=1 regenerates it; review the diff)"
