"""The follower's decisions (p2pgen.core.follower), pinned by transcripts and checked against the machine.

Transcripts: tests/core/testdata/follower/*.txt (format: tests/core/follower_transcript.py); each one simulates
members deciding on the JSON view the agent serves, parsed by `JobView.from_json`. `P2PGEN_REWRITE=1 pytest
tests/core/test_follower.py` rewrites the expected output; only commit what you understand.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from follower_transcript import run_follower_transcript
from transcript import check_transcript

TESTDATA = Path(__file__).parent / "testdata" / "follower"
FILES = sorted(TESTDATA.glob("*.txt"))


def test_follower_testdata_present():
    assert len(FILES) >= 6, f"expected the follower transcripts under {TESTDATA}"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_follower_transcript(path: Path):
    text = path.read_text()
    directives, outputs, trailing, _ = run_follower_transcript(text)
    check_transcript(path, text, directives, outputs, trailing)
