"""Spot notices: what a file or an endpoint says (parsed), what a bad source does (logged once per kind, nothing
else), and the watcher handing the first notice on; a local HTTP server on 127.0.0.1 plays the endpoint."""

from __future__ import annotations

import http.server
import json
import logging
import threading
import time

import pytest

from p2pgen.agent import notice
from p2pgen.agent.notice import Notice, Problem, parse

pytestmark = pytest.mark.timeout(60)

AT = "2026-12-02T18:00:00Z"
AT_S = 1796234400.0


@pytest.mark.parametrize("status, body, expected", [
    (404, "", None), (200, "", None), (200, "FALSE", None), (200, "false\n", None),
    (200, json.dumps({"action": "terminate", "time": AT}), Notice(AT_S, "")),
    (200, AT, Notice(AT_S, "")), (200, str(AT_S), Notice(AT_S, "")), (200, "TRUE", Notice(None, "")),
    (200, json.dumps({"Events": [{"EventType": "Freeze"}, {"EventType": "Preempt",
                                                           "NotBefore": "Wed, 02 Dec 2026 18:00:00 GMT"}]}),
     Notice(AT_S, "")),
    (None, "", Notice(None, "")), (None, AT, Notice(AT_S, "")),
])
def test_what_a_source_says(status, body, expected):
    got = parse(status, body)
    if expected is None:
        assert got is None
    else:
        assert isinstance(got, Notice) and got.at == expected.at


@pytest.mark.parametrize("status, body, kind", [(500, "", "status"), (200, "<html>oops</html>", "garbage"),
                                                (200, json.dumps({"action": "none"}), "garbage"),
                                                (200, json.dumps({"Events": []}), "garbage")])
def test_what_is_not_a_notice_is_a_problem_of_one_kind(status, body, kind):
    got = parse(status, body)
    assert isinstance(got, Problem) and got.kind == kind


class Endpoint:
    """A local HTTP server whose answer the test sets: (status, body, delay)."""

    def __init__(self) -> None:
        self.answer = (404, "", 0.0)
        self.hits = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:          # noqa: N802 (the stdlib's name)
                owner.hits += 1
                status, body, delay = owner.answer
                time.sleep(delay)
                self.send_response(status)
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/latest/meta-data/spot/instance-action"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    e = Endpoint()
    try:
        yield e
    finally:
        e.close()


def test_an_endpoint_is_polled_until_it_names_a_time_and_bad_answers_are_said_once(endpoint, caplog):
    got: list[Notice] = []
    watcher = notice.watcher(None, endpoint.url, 0.05, got.append)
    caplog.set_level(logging.WARNING, logger="p2pgen.agent.notice")
    watcher.start()
    try:
        time.sleep(0.3)                                   # 404: nothing
        endpoint.answer = (200, "garbage!", 0.0)
        time.sleep(0.3)
        endpoint.answer = (503, "", 0.0)
        time.sleep(0.3)
        assert got == [] and endpoint.hits > 5
        endpoint.answer = (200, json.dumps({"action": "terminate", "time": AT}), 0.0)
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watcher.stop()
    assert [n.at for n in got] == [AT_S]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings                     # one per kind, though each was read several times
    assert any("not a notice: 'garbage!'" in w for w in warnings) and any("HTTP status 503" in w for w in warnings)


def test_a_slow_or_unreachable_endpoint_changes_nothing(endpoint):
    endpoint.answer = (200, "TRUE", 1.5)
    slow = notice.read_url(endpoint.url, timeout=0.3)
    assert isinstance(slow, Problem) and slow.kind == "slow"
    gone = notice.read_url("http://127.0.0.1:9/", timeout=0.5)        # the discard port: nobody listens
    assert isinstance(gone, Problem) and gone.kind == "unreachable"


def test_a_file_is_a_notice_once_it_appears(tmp_path):
    path = tmp_path / "notice"
    assert notice.read_file(str(path)) is None
    path.write_text("")
    assert notice.read_file(str(path)) == Notice(None, "(an empty notice file)")
    path.write_text(AT)
    assert notice.read_file(str(path)).at == AT_S


def test_sources_are_named_by_the_operator_only():
    assert notice.watcher(None, None, 1.0, lambda n: None) is None       # no default: nothing is polled
    with pytest.raises(ValueError, match="not both"):
        notice.watcher("f", "http://x", 1.0, lambda n: None)
    with pytest.raises(ValueError, match="http:// or https://"):
        notice.watcher(None, "file:///etc/passwd", 1.0, lambda n: None)
    with pytest.raises(ValueError, match="positive"):
        notice.watcher("f", None, 0, lambda n: None)
