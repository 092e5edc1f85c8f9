"""Runs every transcript in tests/core/testdata/*.txt (format: see tests/core/transcript.py).

`P2PGEN_REWRITE=1 pytest tests/core` rewrites the expected output instead of comparing it. Only commit
rewritten files if you understand the diff.

Besides the expected output, each transcript is replayed from its command log onto a fresh machine, which
must end in the same state and history (I1: same log, same state), and no output may contain `ERROR`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from transcript import format_transcript, run_transcript

from p2pgen.core import GenerationMachine
from p2pgen.core.render import history_json, render_state, state_json

TESTDATA = Path(__file__).parent / "testdata"
FILES = sorted(TESTDATA.glob("*.txt"))
REWRITE = os.environ.get("P2PGEN_REWRITE") == "1"


def test_testdata_present():
    assert len(FILES) >= 10, f"expected the transcript files under {TESTDATA}"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_transcript(path: Path):
    text = path.read_text()
    directives, outputs, trailing, interp = run_transcript(text)
    actual = format_transcript(directives, outputs, trailing)

    errors = [f"{d.line!r} (line {d.lineno}): {line}" for d, out in zip(directives, outputs)
              for line in out if line.startswith("ERROR")]
    assert not errors, "\n".join(errors)

    # I1: a replica fed the same log, at the same positions, ends in the same state and history.
    replica = GenerationMachine(interp.machine.job)
    for command, position in interp.log:
        replica.apply(command, position)
    assert render_state(replica) == render_state(interp.machine)
    assert json.dumps(state_json(replica), sort_keys=True) == json.dumps(state_json(interp.machine), sort_keys=True)
    assert history_json(replica) == history_json(interp.machine)

    if REWRITE:
        if actual != text:
            path.write_text(actual)
        return
    assert actual == text, f"{path.name}: output differs (P2PGEN_REWRITE=1 regenerates it; review the diff)"


def test_parser_rejects_missing_separator():
    from transcript import parse
    with pytest.raises(ValueError, match="must be followed by"):
        parse("state\nmembers: []\n")


def test_interpreter_flags_unused_arguments():
    _, outputs, _, _ = run_transcript("register a 1 agent=x bogus\n----\n")
    # 'bogus' is positional and would make `peer, inc = pos` fail: reported as an error, not swallowed
    assert outputs[0][0].startswith("ERROR")
