"""File commands on a .safetensors workspace never import torch (they run here with torch
poisoned), give the same ids and statistics as the torch path, and give back the committed
file byte for byte."""

import hashlib
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import edit_object, raw, vrl
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from test_safetensors_file import close, handmade, torch_reference

from vrl import Repo
from vrl.diff import is_counter, layer_of
from vrl.errors import CorruptObjectError
from vrl.safetensors_file import parse_header
from vrl.workspace import write_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def policy(version: int) -> dict:
    """A realistic mix: bfloat16 weights, float16 biases, int8 quantised weights with
    float32 scales, a bool mask, a 0-d step, an empty buffer, a float8 table."""
    g = torch.Generator().manual_seed(0)
    sd = {}
    for i in range(6):
        sd[f"encoder.{i}.weight"] = torch.randn(48, 32, generator=g).to(torch.bfloat16)
        sd[f"encoder.{i}.bias"] = torch.randn(48, generator=g).half()
    sd["head.qweight"] = (torch.randn(16, 48, generator=g) * 40).to(torch.int8)
    sd["head.scale"] = torch.rand(16, generator=g)
    sd["head.mask"] = torch.rand(16, generator=g) > 0.5
    sd["step"] = torch.tensor(1000 * version, dtype=torch.int64)
    sd["buffers.empty"] = torch.empty(0, 5)
    sd["table.f8"] = torch.randn(64, generator=g).to(torch.float8_e4m3fn)
    if version >= 2:
        sd["encoder.1.weight"] = (sd["encoder.1.weight"].float() * 1.02).to(torch.bfloat16)
        sd["head.qweight"] = sd["head.qweight"].clone()
        sd["head.qweight"][3, :5] += 1
        sd["head.mask"] = ~sd["head.mask"]
        sd["table.f8"] = (sd["table.f8"].float() + 0.25).to(torch.float8_e4m3fn)
    return sd


@pytest.fixture
def poisoned(tmp_path):
    """A directory whose `torch` package records that it was imported, then fails."""
    root = tmp_path / "poison"
    (root / "torch").mkdir(parents=True)
    marker = tmp_path / "torch-was-imported"
    (root / "torch" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'a').write('imported\\n')\n"
        "raise ImportError('torch is poisoned in this test')\n")
    return root, marker


def cli(ws, poison, *args):
    """Run `vrl ARGS` in a fresh interpreter that cannot import torch."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(poison), str(ROOT)]),
           "VRL_AUTHOR": "tester"}
    proc = subprocess.run([sys.executable, "-c",
                           "import sys; from vrl.cli import main; sys.exit(main(sys.argv[1:]))",
                           *args], cwd=ws, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc.stdout


def reference_layers(old: dict, new: dict) -> dict:
    """Layer statistics computed with torch (the path vrl used before)."""
    sums: dict[str, list[float]] = {}
    for name, t in new.items():
        # a scalar step counter is left out of the statistics (it only says "changed")
        d2, o2, mx = ((0.0, 0.0, 0.0) if is_counter(name, tuple(t.shape))
                      else torch_reference(old[name], t))
        s = sums.setdefault(layer_of(name), [0.0, 0.0, 0.0, 0])
        s[0] += d2
        s[1] += o2
        s[2] = max(s[2], mx)
        s[3] += raw(old[name]) != raw(t)
    return {layer: (math.sqrt(d2) / max(math.sqrt(o2), 1e-12), mx)
            for layer, (d2, o2, mx, changed) in sums.items() if changed}


def test_file_commands_never_import_torch(tmp_path, poisoned):
    poison, marker = poisoned
    ws = tmp_path / "ws"
    ws.mkdir()
    v1, v2 = tmp_path / "v1.safetensors", tmp_path / "v2.safetensors"
    save_file(policy(1), str(v1), metadata={"format": "pt", "source": "test", "b": "2"})
    save_file(policy(2), str(v2), metadata={"format": "pt", "source": "test", "b": "3"})
    ws_file = ws / "policy.safetensors"
    ws_file.write_bytes(v1.read_bytes())

    cli(ws, poison, "init")
    first = json.loads(cli(ws, poison, "commit", "-m", "v1", "--json"))["id"]
    assert json.loads(cli(ws, poison, "status", "--json"))["status"] == "clean"
    ws_file.write_bytes(v2.read_bytes())
    status = json.loads(cli(ws, poison, "status", "--json"))
    assert status["status"] == "modified"
    diff = json.loads(cli(ws, poison, "diff", "--json"))
    second = json.loads(cli(ws, poison, "commit", "policy.safetensors", "-m", "v2",
                            "--json"))["id"]
    shown = json.loads(cli(ws, poison, "show", "--json"))
    assert [e["id"] for e in json.loads(cli(ws, poison, "log", "--json"))] == [second, first]
    cli(ws, poison, "tag", "best", first)
    cli(ws, poison, "branch", "side", first)
    assert "side" in cli(ws, poison, "branch")
    assert cli(ws, poison, "checkout", "best").startswith("HEAD is now at")
    assert sha(ws_file) == sha(v1)
    cli(ws, poison, "export", "main", "out.safetensors")
    assert sha(ws / "out.safetensors") == sha(v2)
    cli(ws, poison, "reset", "--hard", second)
    assert sha(ws_file) == sha(v2)
    assert "reset: moving to" in cli(ws, poison, "reflog")
    assert not marker.exists(), "a file command imported torch"

    # The torch path (the file read by safetensors into torch tensors, as vrl did before,
    # and committed from memory) stores the same tensor objects under the same names...
    repo = Repo(ws)
    ref = Repo.init(tmp_path / "ref")
    for path in (v1, v2):
        with safe_open(str(path), framework="pt") as f:
            ref.commit({k: f.get_tensor(k) for k in f.keys()}, env=False)  # noqa: SIM118
    for ours, theirs in ((second, ref.head()), (first, ref.resolve("HEAD~1"))):
        a = repo.read_manifest(repo.read_commit(ours).manifest)
        b = ref.read_manifest(ref.read_commit(theirs).manifest)
        assert a.tensors == b.tensors and a.tree == b.tree
    # ... and its statistics are what torch computes
    want = reference_layers(load_file(str(v1)), load_file(str(v2)))
    for result in (diff, shown["diff"], status["diff"]):
        changed = {k: v for k, v in result["layers"].items() if v["status"] == "changed"}
        assert set(changed) == set(want)
        for layer, (rel, mx) in want.items():
            assert close(changed[layer]["rel"], rel, 5e-5), layer
            assert changed[layer]["max_abs"] == mx, layer


# ------------------------------------------------------------------------------ exact files


def library_file(path):
    save_file(policy(1), str(path), metadata={"format": "pt", "z": "last", "a": "first",
                                              "m": "ü"})


def reversed_order(path):  # JSON lists tensors in the opposite order to their data
    entries = [("z.w", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
               ("a.b", "BF16", [3], b"\x80\x3f\x00\x40\x40\x40"),
               ("m.e", "F16", [0], b""), ("m.e2", "I8", [0], b""), ("s", "I64", [], b"\7" * 8)]
    path.write_bytes(handmade(entries, order=["s", "m.e2", "m.e", "a.b", "z.w"]))


def odd_padding(path):  # header of a length no library writes, metadata in the middle
    entries = [("w\u00fc\\n", "U8", [5], b"abcde"), ("flag", "BOOL", [2, 1], b"\1\0")]
    doc = handmade(entries, metadata={"note": "hand made"}, pad=13)
    path.write_bytes(doc)


def escaped_json(path):  # same tensors, but spelled with escapes and whitespace
    text = (b'{ "\\u0061": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},\n'
            b'  "__metadata__": {"k": "\\u00fc"} }')
    path.write_bytes(struct.pack("<Q", len(text)) + text + struct.pack("<f", 1.5))


@pytest.mark.parametrize("make", [library_file, reversed_order, odd_padding, escaped_json])
def test_checkout_export_and_reset_give_back_the_committed_bytes(ws, capsys, make):
    vrl(capsys, "init")
    make(ws / "policy.safetensors")
    want = sha(ws / "policy.safetensors")
    code, out, err = vrl(capsys, "commit", "-m", "original", "--no-env")
    assert code == 0, err
    repo = Repo(ws)
    manifest = repo.read_manifest(repo.read_commit(repo.head()).manifest)
    assert manifest.layout is not None and manifest.layout.format == "safetensors"
    # a different policy on top, then back
    write_checkpoint({"other": torch.ones(3)}, ws / "policy.safetensors")
    vrl(capsys, "commit", "-m", "other", "--no-env")
    code, _, err = vrl(capsys, "checkout", "HEAD~1")
    assert code == 0, err
    assert sha(ws / "policy.safetensors") == want
    vrl(capsys, "checkout", "main")
    vrl(capsys, "export", "HEAD~1", "exported.safetensors")
    assert sha(ws / "exported.safetensors") == want
    vrl(capsys, "reset", "--hard", "HEAD~1")
    assert sha(ws / "policy.safetensors") == want
    # the re-read file is the committed snapshot (no index: hashed again)
    (ws / ".vrl" / "index").unlink()
    code, out, _ = vrl(capsys, "status")
    assert "no changes since HEAD" in out
    # .pt export still works and holds the same tensors
    vrl(capsys, "export", "HEAD", "exported.pt")
    back = torch.load(ws / "exported.pt", weights_only=True)
    lib = {k: v for k, v in Repo(ws).load("HEAD").items()}
    assert sorted(back) == sorted(lib)
    assert Repo(ws).fsck()["ok"]


def test_files_vrl_writes_need_no_stored_header(ws, capsys):
    """A snapshot from memory is exported in the canonical layout; committing that file
    again is the same snapshot (nothing changed), and exporting it again the same bytes."""
    repo = Repo.init(ws)
    state = {"model": {"w": torch.randn(4, 4), "b": torch.zeros(4, dtype=torch.bfloat16)},
             "step": 3, "opt": {"lr": 0.1}}
    first = repo.commit(state, env=False)
    repo.export(first, ws / "a.safetensors")
    code, _, err = vrl(capsys, "commit", "a.safetensors", "--no-env")
    assert code == 1 and "nothing changed" in err
    Repo(ws).export(first, ws / "b.safetensors")
    assert sha(ws / "a.safetensors") == sha(ws / "b.safetensors")
    meta = parse_header((ws / "a.safetensors").read_bytes()).metadata
    assert sorted(meta) == ["format", "vrl.numpy", "vrl.ties", "vrl.tree"]


def test_header_survives_gc_and_travels_with_push_and_clone(ws, capsys):
    (ws / "a").mkdir()
    os.chdir(ws / "a")
    vrl(capsys, "init")
    library_file(Path("policy.safetensors"))
    want = sha("policy.safetensors")
    vrl(capsys, "commit", "-m", "v1", "--no-env")
    assert Repo(".").gc(grace=0) == (0, 0)
    vrl(capsys, "remote", "add", "origin", str(ws / "r.vrl"), "--create")
    code, _, err = vrl(capsys, "push", "-q")
    assert code == 0, err
    os.chdir(ws)
    code, _, err = vrl(capsys, "clone", str(ws / "r.vrl"), "b", "-q")
    assert code == 0, err
    assert sha(ws / "b" / "policy.safetensors") == want
    assert Repo(ws / "b").fsck()["ok"]


def test_damaged_stored_header_is_reported(ws, capsys):
    vrl(capsys, "init")
    library_file(ws / "policy.safetensors")
    vrl(capsys, "commit", "--no-env")
    repo = Repo(ws)
    layout = repo.read_manifest(repo.read_commit(repo.head()).manifest).layout
    edit_object(repo, layout.header.id,  # inside the JSON, same size
                lambda data: data.__setitem__(64 + 9, ord("[")))
    # (hashed before it is parsed: the damaged object is named)
    with pytest.raises(CorruptObjectError, match=f"object {layout.header.id[:12]} is corr"):
        repo.export(repo.head(), ws / "out.safetensors")
    assert not (ws / "out.safetensors").exists()
    assert not repo.fsck()["ok"]


@pytest.mark.parametrize("case", ["hole", "overlap"])
def test_files_safetensors_forbids_are_refused(ws, capsys, case):
    doc = {"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
           "b": {"dtype": "U8", "shape": [2], "data_offsets": [3, 5] if case == "hole"
                 else [1, 3]}}
    text = json.dumps(doc).encode()
    (ws / "bad.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 5)
    vrl(capsys, "init")
    code, out, err = vrl(capsys, "commit", "bad.safetensors", "--no-env")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith("error: bad.safetensors: not a valid safetensors file: ")
    assert Repo(ws).head() is None


def test_repository_api_takes_raw_tensors_without_torch(tmp_path, poisoned):
    """Repo.commit/snapshot accept raw tensors (bytes + dtype name) and numpy arrays, and
    export them, all without torch."""
    poison, marker = poisoned
    script = f"""
import struct, sys
import numpy as np
from vrl import Repo
from vrl.safetensors_file import RawTensor, read_file
from vrl.tensors import file_state
repo = Repo.init({str(tmp_path / "r")!r})
w = RawTensor("bfloat16", (2, 2), struct.pack("<4H", 0x3f80, 0x4000, 0x4040, 0xbf80))
state = {{"w": w, "tied": w, "n": np.arange(3, dtype=np.int16), "step": 3}}
first = repo.commit(state, env=False)
state["w"] = RawTensor("bfloat16", (2, 2), struct.pack("<4H", 0x3f80, 0x4000, 0x4040, 0x3f80))
second = repo.commit(state, env=False)
layers = repo.diff(second).to_json()["layers"]
assert layers["w"]["status"] == "changed" and layers["w"]["max_abs"] == 2.0, layers
manifest = repo.read_manifest(repo.read_commit(first).manifest)
assert manifest.tensors["tied"].tie == "w" and manifest.tensors["n"].dtype == "numpy:<i2"
repo.export(first, {str(tmp_path / "x.safetensors")!r})
f = read_file({str(tmp_path / "x.safetensors")!r})
back = file_state(f)
assert bytes(back["w"].data) == bytes(w.data) and back["tied"] is back["w"]
assert back["n"].tolist() == [0, 1, 2] and back["step"] == 3
try:
    RawTensor("float32", (3,), b"12345678")
except Exception as exc:
    assert "cannot hold" in str(exc)
else:
    raise AssertionError("a size mismatch was accepted")
assert "torch" not in sys.modules
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(poison), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()


HEAVY = ("yaml", "importlib.metadata", "concurrent.futures")


def modules_loaded(ws, *args) -> set[str]:
    """The modules `vrl ARGS` imported, run in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VRL_AUTHOR": "tester"}
    proc = subprocess.run([sys.executable, "-c",
                           "import sys; from vrl.cli import main; code = main(sys.argv[1:]); "
                           "print(*sorted(sys.modules), file=sys.stderr); sys.exit(code)",
                           *args], cwd=ws, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return set(proc.stderr.split())


def test_file_and_history_commands_skip_the_heavy_imports(tmp_path):
    """Start-up is most of a command's time: `commit FILE` (environment captured) and the
    history commands import neither PyYAML (only --set values other than one number, boolean
    or null need it) nor
    importlib.metadata, and the read-only ones no thread pools either."""
    ws = tmp_path / "ws"
    ws.mkdir()
    save_file(policy(1), str(ws / "policy.safetensors"))
    modules_loaded(ws, "init")
    loaded = modules_loaded(ws, "commit", "-m", "v1", "--step", "3", "--metric", "r=1")
    assert "torch" not in loaded and not loaded & set(HEAVY[:2]), loaded & set(HEAVY)
    for args in (["log"], ["log", "--oneline"], ["show"], ["status"], ["diff", "HEAD"]):
        loaded = modules_loaded(ws, *args)
        assert not loaded & {"torch", *HEAVY}, (args, loaded & {"torch", *HEAVY})
    assert "yaml" not in modules_loaded(ws, "commit", "-m", "v2", "--allow-empty", "--set",
                                        "lr=3e-4")  # (one number: resolved without it)
    assert "yaml" in modules_loaded(ws, "commit", "-m", "v3", "--allow-empty", "--set",
                                    "layers=[64, 64]")
