"""Fixtures: servers started here are closed here, processes are stopped by pid."""

from __future__ import annotations

import pytest

from tests.state.helpers import SourceProcess, open_server


@pytest.fixture
def servers():
    """`servers(state, me, allowed=None, **kw)` opens a StateServer; all are closed after the test."""
    opened = []

    def make(state, me, allowed=None, **kw):
        opened.append(open_server(state, me, allowed, **kw))
        return opened[-1]
    yield make
    for s in opened:
        s.close()


@pytest.fixture
def source_processes():
    """`source_processes(...)` starts a SourceProcess; each is killed by pid after the test."""
    started = []

    def start(*args):
        started.append(SourceProcess(*args))
        return started[-1]
    yield start
    for p in started:
        p.stop()
