"""The follower's decisions (p2pgen.core.follower), pinned by transcripts and checked against the machine.

Transcripts: tests/core/testdata/follower/*.txt (format: tests/core/follower_transcript.py); each one simulates
members deciding on the JSON view the agent serves, parsed by `JobView.from_json`. `P2PGEN_REWRITE=1 pytest
tests/core/test_follower.py` rewrites the expected output; only commit what you understand.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from follower_transcript import format_transcript, run_follower_transcript

TESTDATA = Path(__file__).parent / "testdata" / "follower"
FILES = sorted(TESTDATA.glob("*.txt"))
REWRITE = os.environ.get("P2PGEN_REWRITE") == "1"


def test_follower_testdata_present():
    assert len(FILES) >= 6, f"expected the follower transcripts under {TESTDATA}"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_follower_transcript(path: Path):
    text = path.read_text()
    directives, outputs, trailing, _ = run_follower_transcript(text)
    errors = [f"{d.line!r} (line {d.lineno}): {line}" for d, out in zip(directives, outputs)
              for line in out if line.startswith("ERROR")]
    assert not errors, "\n".join(errors)
    actual = format_transcript(directives, outputs, trailing)
    if REWRITE:
        if actual != text:
            path.write_text(actual)
        return
    assert actual == text, f"{path.name}: output differs (P2PGEN_REWRITE=1 regenerates it; review the diff)"
