"""The package imports lazily: the pure layers load without the data plane, every public name resolves, the
public surface is what an application uses (and is documented), and the runtime (everything in `p2pgen/`)
imports nothing from the lab (`p2pgen_lab`), whose commands reach the command line through entry points."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

import p2pgen
from p2pgen import cli
from p2pgen.peer import Peer
from p2pgen.state import SharedState

pytestmark = pytest.mark.timeout(60)

HEAVY = ("numpy", "msgpack", "p2pgen.transport", "p2pgen.collectives", "torch")
PACKAGE = Path(p2pgen.__file__).parent
LAB = "p2pgen_lab"
LAB_NAME = re.compile(rf"{LAB}(\.\w+)*")
LAB_COMMANDS = {"bench", "sim", "chaos", "stress", "check-traces"}
TESTING_DOUBLES = {"__init__.py", "cluster.py", "conformance.py", "fake_nccl.py", "ports.py"}


def _is_lab(module: str) -> bool:
    return module == LAB or module.startswith(f"{LAB}.")


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = ("p2pgen",) + path.relative_to(PACKAGE).parent.parts
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ((node.module,) if node.module else ()))


def _imported(path: Path, node: ast.AST) -> list[str]:
    """The modules `node` imports (a `from M import N` may import the submodule M.N), or names as a string that
    `importlib.import_module` could import (a docstring that mentions a module is not a full match)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        module = _absolute(path, node)
        return [module] + [f"{module}.{a.name}" for a in node.names]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and LAB_NAME.fullmatch(node.value):
        return [node.value]   # import_module(...)
    return []


def _lab_imports(path: Path, source: str) -> list[str]:
    """`FILE:LINE: imports MODULE` for every lab module `source` (the text of `path`, in the runtime) imports."""
    return [f"{path.relative_to(PACKAGE.parent).as_posix()}:{node.lineno}: imports {module}"
            for node in ast.walk(ast.parse(source, str(path))) for module in _imported(path, node) if _is_lab(module)]


def test_the_runtime_imports_nothing_from_the_lab() -> None:
    found = [line for path in sorted(PACKAGE.rglob("*.py")) for line in _lab_imports(path, path.read_text())]
    assert not found, "the runtime must not import the lab (move what it needs into the runtime):\n" + \
        "\n".join(found)


def test_the_scan_names_the_file_and_line_of_every_kind_of_lab_import() -> None:
    source = ("import p2pgen_lab.stress.plan\nfrom p2pgen_lab import chaos\nfrom p2pgen_lab.bench import cli\n"
              "importlib.import_module('p2pgen_lab.simulator')\nfrom p2pgen.state import SharedState\n"
              "import p2pgen_labs\n'p2pgen_lab is the lab'\n")
    found = _lab_imports(PACKAGE / "agent" / "example.py", source)
    assert sorted(found) == ["p2pgen/agent/example.py:1: imports p2pgen_lab.stress.plan",
                             "p2pgen/agent/example.py:2: imports p2pgen_lab",
                             "p2pgen/agent/example.py:2: imports p2pgen_lab.chaos",
                             "p2pgen/agent/example.py:3: imports p2pgen_lab.bench",
                             "p2pgen/agent/example.py:3: imports p2pgen_lab.bench.cli",
                             "p2pgen/agent/example.py:4: imports p2pgen_lab.simulator"]


def test_the_lab_lives_outside_the_runtime_and_testing_keeps_only_its_doubles() -> None:
    assert not [d for d in ("bench", "chaos", "stress", "simulator") if (PACKAGE / d).exists()]
    assert {p.name for p in (PACKAGE / "testing").glob("*.py")} == TESTING_DOUBLES
    assert (PACKAGE.parent / LAB / "__init__.py").exists()


def test_a_runtime_command_loads_no_lab_module_and_a_lab_command_its_own() -> None:
    code = ("import sys; from p2pgen import cli; cli.build_parser({argv!r}); "
            f"print(sorted(m for m in sys.modules if m == {LAB!r} or m.startswith({LAB + '.'!r})))")
    loaded = {argv[0]: subprocess.run([sys.executable, "-c", code.format(argv=argv)], capture_output=True, text=True,
                                      check=True).stdout.strip() for argv in (["join", "--local", "3"], ["chaos"])}
    assert loaded["join"] == "[]", f"`p2pgen join` imported the lab: {loaded['join']}"
    assert "p2pgen_lab.chaos.cli" in loaded["chaos"] and "p2pgen_lab.bench" not in loaded["chaos"]


def test_the_lab_commands_are_registered_entry_points_and_help_lists_them() -> None:
    assert set(cli.registered_commands()) == LAB_COMMANDS
    choices = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert LAB_COMMANDS | {"join", "show", "history", "fault"} <= set(choices)


def test_a_command_whose_module_fails_to_import_says_which_and_why(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    broken = EntryPoint("broken", "p2pgen_lab.no_such_module:add_commands", cli.COMMAND_GROUP)
    monkeypatch.setattr(cli, "registered_commands", lambda: {"broken": broken})
    assert "p2pgen_lab.no_such_module failed to import" in cli.build_parser().format_help()
    assert cli.main(["broken", "--flag"]) == cli.BROKEN_EXIT
    err = capsys.readouterr().err
    assert "p2pgen broken: its module p2pgen_lab.no_such_module" in err
    assert "ModuleNotFoundError: No module named 'p2pgen_lab.no_such_module'" in err


@pytest.mark.parametrize("module", ["p2pgen.core", "p2pgen.detect"])
def test_the_pure_layers_import_without_numpy_msgpack_or_the_transport(module: str) -> None:
    code = f"import sys, {module}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"importing {module} loaded {out}"


def test_every_public_name_resolves_and_an_unknown_one_says_so() -> None:
    for name in p2pgen.__all__:
        assert getattr(p2pgen, name) is not None, name
    assert set(p2pgen.__all__) <= set(dir(p2pgen))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        p2pgen.Nope  # noqa: B018


INTERNALS = ("GenerationMachine", "Certificate", "Frontier", "Member", "plan_ownership", "Partition", "Backend",
             "TcpBackend")
PEER_API = {"steps", "channel", "inbox", "close", "rank", "world", "generation",           # methods, properties
            "job", "state", "peer_id", "incarnation", "certificate", "stats",              # attributes
            "wire_counters"}
STATE_API = {"shard", "digest", "tensor_digests", "touch", "save_checkpoint"}


def test_the_package_exports_what_an_application_uses_and_names_no_internal() -> None:
    assert sorted(p2pgen.__all__) == sorted(p2pgen._EXPORTS)
    for name in INTERNALS:
        with pytest.raises(AttributeError, match="imported from their own module"):
            getattr(p2pgen, name)


def _assigned_attributes(cls: type) -> set[str]:
    """The attributes `cls`'s methods assign on `self` (found in its source)."""
    tree = ast.parse(Path(sys.modules[cls.__module__].__file__).read_text())
    body = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    return {t.attr for n in ast.walk(body) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            for t in (t.elts if isinstance(t, ast.Tuple) else [t])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


def test_peer_and_shared_state_keep_their_internals_private() -> None:
    peer = {n for n in set(vars(Peer)) | _assigned_attributes(Peer) if not n.startswith("_")}
    assert peer == PEER_API, "a new public Peer member: make it private or add it to docs/reference/api.md"
    state = {n for n, v in vars(SharedState).items() if callable(v) and not n.startswith("_")}
    assert state == STATE_API, "SharedState's protocol methods are private; step.commit() is the only commit"


def test_every_public_name_is_in_the_api_reference() -> None:
    text = (PACKAGE.parent / "docs" / "reference" / "api.md").read_text()
    missing = [name for name in p2pgen.__all__ + sorted(PEER_API | STATE_API) if f"`{name}" not in text]
    assert not missing, f"docs/reference/api.md does not document {missing}"
