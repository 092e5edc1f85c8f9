"""`p2pgen show --watch` redraws on generation changes; `join --http` serves a read-only status page that a
real headless browser renders (skipped, with the reason, where no Chromium is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from p2pgen.agent.watch import last_fault
from p2pgen_lab.rigs.agents import active_members, free_control_ports, free_service_port

HTTP_PORT = free_service_port()


def _entry(generation: int, members: list[str], reason: str, at: float, outcome: str = "activated") -> dict:
    return {"generation": generation, "outcome": outcome, "at": at, "reason": reason, "certificate": None,
            "members": [{"peer_id": m, "incarnation": 1} for m in members]}


def test_last_fault_is_the_latest_shrink_and_its_recovery():
    history = [_entry(1, ["a", "b", "c"], "c#1 joined", 100.0),
               _entry(2, ["a", "b"], "c#1 removed (application killed)", 101.0),
               _entry(3, ["a", "b", "c"], "c#2 joined", 104.5),
               _entry(4, ["a", "c"], "b#1 removed (agent silent)", 110.0),
               _entry(5, ["a", "b", "c"], "b#2 joined", 111.0, outcome="abandoned")]
    text = last_fault(history)
    assert text.startswith("last fault: generation 4 at ") and "b#1 removed (agent silent)" in text
    assert text.endswith("2 of 3 members, not recovered yet")
    assert "recovered in 3.5 s (generation 3, 3 members)" in last_fault(history[:3])
    assert last_fault(history[:1]) is None


def _start_two(cluster, extra=()):
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(3)]
    cluster.start("p0", addrs[0], [addrs[1]], extra=("--min-members=2", *extra))
    cluster.start("p1", addrs[1], [addrs[0]], extra=("--min-members=2",))
    cluster.wait(addrs[0], lambda s: len(active_members(s)) == 2, timeout=60)
    return addrs


def _read_until(proc: subprocess.Popen, needle: str) -> str:
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if needle in line:
            return "".join(seen)
    raise AssertionError(f"show --watch ended before {needle!r}:\n{''.join(seen)}")


@pytest.mark.timeout(120)
def test_show_watch_redraws_when_a_generation_changes(cluster):
    addrs = _start_two(cluster)
    watcher = subprocess.Popen([sys.executable, "-m", "p2pgen", "show", "--watch", "--peer", addrs[0],
                                "--secret-file", str(cluster.secret_file)], stdout=subprocess.PIPE, text=True)
    try:
        first = _read_until(watcher, "watching; redrawn")
        assert "generation 1 " in first and "last fault: none" in first
        cluster.start("p2", addrs[2], [addrs[0]])
        second = _read_until(watcher, "watching; redrawn")
        while "p2#" not in second or "generation 2 " not in second:     # a pending proposal may come first
            second = _read_until(watcher, "watching; redrawn")
    finally:
        watcher.terminate()
        watcher.wait(10)


def _get(path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{HTTP_PORT}{path}", timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _browser() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.mark.timeout(120)
def test_status_page_is_read_only_json_and_renders_in_a_headless_browser(cluster):
    addrs = _start_two(cluster, extra=(f"--http={HTTP_PORT}",))
    status, body = _get("/status.json")
    assert status == 200
    status_json = json.loads(body)
    assert status_json["show"]["state"]["active"]["generation"] >= 1
    assert _get("/nothing-here")[0] == 404
    post = urllib.request.Request(f"http://127.0.0.1:{HTTP_PORT}/status.json", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(post, timeout=10)
    assert refused.value.code == 501                         # nothing on the page changes the job
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium installed (looked for chromium, chromium-browser, google-chrome): "
                    "the page was checked over HTTP only")
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=8000",
                          "--dump-dom", f"http://127.0.0.1:{HTTP_PORT}/"], capture_output=True, text=True,
                         timeout=90).stdout
    shown = re.search(r'<span id="generation">(\d+)</span>', dom)     # the script ran and filled it in
    assert shown and int(shown.group(1)) >= 1, dom
    assert "<td>p0</td>" in dom and "<td>p1</td>" in dom, dom
    assert addrs[0] in dom
