"""The package imports lazily: the pure layers load without the data plane, and every public name resolves."""

from __future__ import annotations

import subprocess
import sys

import pytest

import p2pgen

pytestmark = pytest.mark.timeout(60)

HEAVY = ("numpy", "msgpack", "p2pgen.transport", "p2pgen.collectives", "torch")


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
