"""Commit messages from the baseline on keep the project's form: a subject of at most 72 characters, a blank line,
then a body (symptom, cause, rule, `Test:`; a merge says what it brings in).

Pure and fast: reads `git log`. The history before BASELINE is left as it is (main is never rewritten); a checkout
without that history (no git, a shallow clone, an archive) skips with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "b1d6d9d7d4dacaf6d9dc9d715b4421bdab659427"   # the last commit before this check
SUBJECT_MAX = 72


def message_problems(commit: str, message: str) -> list[str]:
    """What is wrong with one commit message, as `commit: what` lines (none when it keeps the form).

    Args:
        commit: the commit's short hash, for the lines.
        message: the whole message, subject first.
    """
    lines = message.rstrip("\n").split("\n")
    subject = lines[0]
    problems = []
    if not subject.strip():
        problems.append(f"{commit}: empty subject")
    if len(subject) > SUBJECT_MAX:
        problems.append(f"{commit}: subject of {len(subject)} characters (at most {SUBJECT_MAX}): {subject!r}")
    if len(lines) > 1 and lines[1].strip():
        problems.append(f"{commit}: no blank line after the subject")
    if not any(line.strip() for line in lines[2:]):
        problems.append(f"{commit}: no body (say the symptom, the cause, the rule and `Test:`)")
    return problems


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)


def _commits_since_baseline() -> list[tuple[str, str]]:
    """(short hash, message) of every commit after BASELINE on HEAD, or skip when that history is not here."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: commit messages cannot be read")
    if _git("cat-file", "-e", f"{BASELINE}^{{commit}}").returncode != 0:
        pytest.skip(f"the baseline commit {BASELINE[:7]} is not in this clone (shallow or partial)")
    log = _git("log", "--format=%h%x00%B%x01", f"{BASELINE}..HEAD")
    assert log.returncode == 0, log.stderr
    entries = [entry.strip("\n") for entry in log.stdout.split("\x01") if entry.strip()]
    return [(commit, message) for commit, message in (entry.split("\x00", 1) for entry in entries)]


def test_commit_messages_since_the_baseline_keep_the_form() -> None:
    problems = [p for commit, message in _commits_since_baseline() for p in message_problems(commit, message)]
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("message, expected", [
    ("state: a pulled frontier votes the job's epoch\n\nSymptom: ...\nTest: tests/x.py\n", []),
    ("x" * 73 + "\n\nbody\n", ["c0ffee0: subject of 73 characters"]),
    ("subject\nbody right under it\n", ["c0ffee0: no blank line after the subject", "c0ffee0: no body"]),
    ("merge idlecpu\n", ["c0ffee0: no body"]),
    ("\n\nbody\n", ["c0ffee0: empty subject"]),
])
def test_message_problems_names_each_fault(message: str, expected: list[str]) -> None:
    found = message_problems("c0ffee0", message)
    assert [p[:len(e)] for p, e in zip(found, expected)] == expected and len(found) == len(expected), found
