"""Everything a commit accepts round-trips bit-exactly (memory, store, and files)."""

import random

import numpy as np
import pytest
import torch
from helpers import assert_same, small_policy

from vrl.errors import CheckpointError
from vrl.workspace import read_checkpoint, write_checkpoint

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
          torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64,
          torch.float8_e4m3fn, torch.uint16, torch.uint32, torch.uint64]


def all_dtypes() -> dict:
    g = torch.Generator().manual_seed(1)
    out = {}
    for dt in DTYPES:
        base = torch.randn(3, 5, generator=g) * 50
        if dt == torch.complex64:
            t = torch.complex(base, -base)
        elif dt == torch.bool:
            t = base > 0
        elif dt in (torch.uint16, torch.uint32, torch.uint64):
            t = base.abs().to(torch.int64).to(dt)
        else:
            t = base.to(dt)
        out[str(dt).removeprefix("torch.")] = t
    out["nan_and_negzero"] = torch.tensor([float("nan"), -0.0, float("inf")])
    out["scalar"] = torch.tensor(3.25)
    out["empty"] = torch.empty(0, 4)
    out["noncontig"] = torch.arange(24.0).reshape(4, 6).t()[1:, ::2]
    return out


def full_checkpoint() -> dict:
    model = small_policy()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    random.seed(5)
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 17,
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                    "python": random.getstate()},
            "extra": {"lr": 1e-3, "name": "ppo", "flags": [True, None], "nan": float("nan"),
                      "blob": b"\x00\x01", "dtype": torch.float16, 3: (1, 2.5)}}


@pytest.mark.parametrize("case", ["dtypes", "module", "optimizer", "checkpoint"])
def test_store_round_trip_is_bit_exact(repo, case):
    if case == "dtypes":
        state = all_dtypes()
    elif case == "module":
        state = small_policy()
    elif case == "optimizer":
        state = full_checkpoint()["optimizer"]
    else:
        state = full_checkpoint()
    repo.commit(state, message=case)
    expected = state.state_dict() if isinstance(state, torch.nn.Module) else state
    assert_same(expected, repo.load("HEAD"))
    # a fresh Repo object (no caches) reads the same thing
    from vrl import Repo

    assert_same(expected, Repo(repo.workdir).load("HEAD"))


def test_model_and_optimizer_restore_exactly(repo):
    model = small_policy()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    repo.commit(model, opt, message="a")
    model2 = small_policy(seed=9)
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-3)
    repo.checkout("HEAD", model=model2, optimizer=opt2)
    assert_same(model.state_dict(), model2.state_dict())
    assert_same(opt.state_dict(), opt2.state_dict())


def test_tied_weights_are_stored_once_and_retied(repo):
    emb = torch.nn.Embedding(50, 16)
    head = torch.nn.Linear(16, 50, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    repo.commit(model, message="tied")
    manifest = repo.read_manifest(repo.read_commit(repo.head()).manifest)
    assert manifest.tensors["head.weight"].tie == "emb.weight"
    assert manifest.nbytes == 50 * 16 * 4
    loaded = repo.load("HEAD")
    assert loaded["head.weight"] is loaded["emb.weight"]
    assert_same(model.state_dict(), loaded)


def test_equal_but_untied_tensors_stay_untied(repo):
    state = {"a": torch.zeros(3), "b": torch.zeros(3)}
    repo.commit(state)
    loaded = repo.load("HEAD")
    assert loaded["a"] is not loaded["b"]
    loaded["a"].add_(1)
    assert loaded["b"].sum() == 0


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_file_round_trip(tmp_path, suffix):
    state = full_checkpoint() if suffix == ".safetensors" else \
        {**all_dtypes(), "nested": {"x": torch.ones(2)}, "n": 3}
    path = tmp_path / f"ckpt{suffix}"
    write_checkpoint(state, path)
    assert_same(state, read_checkpoint(path))


def test_plain_safetensors_file_is_read_as_flat_state_dict(tmp_path):
    from safetensors.torch import save_file

    sd = small_policy().state_dict()
    save_file(sd, str(tmp_path / "p.safetensors"))
    back = read_checkpoint(tmp_path / "p.safetensors")
    assert sorted(back) == sorted(sd)
    for k in sd:
        assert torch.equal(sd[k], back[k])


class Custom:
    """An arbitrary Python object: loading it would need pickle."""


def test_pt_that_needs_pickle_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"obj": Custom(), "w": torch.ones(1)}, path)
    with pytest.raises(CheckpointError, match="never unpickles"):
        read_checkpoint(path)


@pytest.mark.parametrize("content", [b"", b"hello, not a checkpoint", b"\x00" * 100])
@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_garbage_files_are_refused(tmp_path, content, suffix):
    path = tmp_path / f"bad{suffix}"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="bad"):
        read_checkpoint(path)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_truncated_files_are_refused(tmp_path, suffix):
    path = tmp_path / f"t{suffix}"
    write_checkpoint(small_policy().state_dict(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError):
        read_checkpoint(path)


def test_missing_file_and_unknown_extension(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        read_checkpoint(tmp_path / "nope.safetensors")
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(CheckpointError, match="unknown checkpoint type"):
        read_checkpoint(tmp_path / "x.txt")


def test_unsupported_values_are_refused_with_their_path(repo):
    with pytest.raises(CheckpointError, match="'a/b'"):
        repo.commit({"a": {"b": object()}})
    with pytest.raises(CheckpointError, match="sparse"):
        repo.commit({"s": torch.eye(3).to_sparse()})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_are_copied_to_cpu(repo):
    t = torch.randn(10, 10, device="cuda")
    repo.commit({"t": t})
    assert_same({"t": t.cpu()}, repo.load("HEAD"))


def test_a_committed_tensor_can_still_be_resized(repo):
    """Committing reads a tensor's bytes in place without `Tensor.numpy()`, which would
    mark its storage as never resizable again: the user's `resize_` after a commit works,
    and the resized tensor is committed as it now is."""
    t = torch.zeros(4)
    state = {"buffer": t, "w": torch.ones(3)}
    repo.commit(state, env=False)
    t.resize_(9)
    t.fill_(2.0)
    cid = repo.commit(state, env=False)
    assert_same(repo.load(cid), state)
    t.resize_(2)  # smaller, same memory
    assert_same(repo.load(repo.commit(state, env=False)), state)


@pytest.mark.parametrize("view", ["conj", "neg"])
def test_conjugate_and_negative_views_are_committed_as_their_values(repo, view):
    g = torch.Generator().manual_seed(3)
    if view == "conj":
        t = torch.complex(torch.randn(5, generator=g), torch.randn(5, generator=g)).conj()
        assert t.is_conj()
    else:
        t = torch._neg_view(torch.randn(5, generator=g))
        assert t.is_neg()
    cid = repo.commit({"t": t, "w": torch.ones(2)}, env=False)
    got = repo.load(cid)["t"]
    assert torch.equal(got, t.resolve_conj().resolve_neg())
    assert not got.is_conj() and not got.is_neg()


def test_a_skeleton_keeps_every_kind_of_value_in_sequences():
    """Sequences of plain scalars are kept as they are (the fast way); anything else in a
    sequence is encoded element by element, as before."""
    from vrl.tensors import DtypeName, flatten, unflatten

    obj = {"rng": (3, tuple(range(5)), None), "plain": [1, "a", True, None],
           "mixed": [1, float("inf"), np.int64(7), (2, 3), [4.5]],
           "dtype": [DtypeName("float32"), "float32"], "empty": [], "none": ()}
    tensors, tree, ties = flatten(obj)
    assert tensors == {} and ties == {}
    assert tree == {"$d": [
        ["rng", {"$tu": [3, {"$tu": [0, 1, 2, 3, 4]}, None]}],
        ["plain", [1, "a", True, None]],
        ["mixed", [1, {"$f": "inf"}, 7, {"$tu": [2, 3]}, [4.5]]],
        ["dtype", [{"$dt": "float32"}, "float32"]],
        ["empty", []], ["none", {"$tu": []}]]}
    back = unflatten(tree, {})
    assert back["rng"] == (3, (0, 1, 2, 3, 4), None) and back["none"] == ()
    assert back["mixed"] == [1, float("inf"), 7, (2, 3), [4.5]]
    assert back["dtype"][0] is torch.float32 and type(back["dtype"][1]) is str
