"""`import vrl` gives the public API lazily: nothing heavy is imported until a name is
used, and every name README's Python examples use resolves."""

import subprocess
import sys

import pytest

import vrl


def test_import_vrl_imports_neither_the_store_nor_torch():
    code = ("import sys, vrl\n"
            "heavy = [m for m in ('torch', 'numpy', 'vrl.repo', 'vrl.snapshotter') "
            "if m in sys.modules]\n"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", vrl.__all__)
def test_every_public_name_resolves(name):
    assert getattr(vrl, name) is not None


def test_submodules_resolve_as_attributes():
    from vrl.hooks import lightning_callback
    from vrl.snapshotter import Snapshotter

    assert vrl.hooks.lightning_callback is lightning_callback
    assert vrl.Snapshotter is Snapshotter and vrl.hooks.Snapshotter is Snapshotter
    assert vrl.remote.clone is not None


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'"):
        vrl.no_such_thing  # noqa: B018
    assert not hasattr(vrl, "no_such_thing")


def test_integrations_resolve_as_attributes_without_their_frameworks():
    """`vrl.integrations.sb3.SnapshotCallback` after a bare `import vrl`, as README shows;
    the framework itself loads only when a callback or loader is made."""
    code = ("import sys, vrl\n"
            "assert callable(vrl.integrations.sb3.SnapshotCallback)\n"
            "assert callable(vrl.integrations.sb3.load)\n"
            "assert vrl.integrations.lightning.restore is not None\n"
            "print([m for m in ('torch', 'stable_baselines3', 'lightning') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    with pytest.raises(AttributeError, match="no attribute 'keras'"):
        vrl.integrations.keras  # noqa: B018
