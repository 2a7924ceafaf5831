"""flatten's memory memo (vrl.tensors.ViewMemo): a tensor split again is recognised by its
memory, never by trust - whatever happened to it in between (written through `.data`,
resized, re-pointed, transposed, swapped for a view of other memory), a split with the
memo gives what the plain definitions give: flatten's names, tree and ties, and
tensor_bytes' bytes, dtype and shape; a commit stores the same manifest."""

import random

import pytest
import torch

from vrl import Repo
from vrl.tensors import ViewMemo, flatten, tensor_bytes


def _check(state, memo):
    plain = flatten(state)
    got = flatten(state, memo)
    assert got[0].keys() == plain[0].keys()
    assert all(got[0][k] is plain[0][k] for k in plain[0])
    assert got[1:] == plain[1:]
    assert memo.last is memo.now
    for name, value in got[0].items():
        rec = memo.now.get(name)
        try:
            buf, dtype, shape, _keep = tensor_bytes(value)
        except RuntimeError:  # (a negated view: refused, with or without the memo)
            assert rec is None
            continue
        if rec is not None:
            assert rec.tensor is value
            assert (bytes(rec.view), rec.dtype, rec.shape) == (bytes(buf), dtype, shape)
    return plain


def _mutate(rng, state, pool):
    try:
        _mutate_once(rng, state, pool)
    except RuntimeError:  # not allowed on this tensor (a storage that cannot be resized...)
        pass


def _mutate_once(rng, state, pool):
    name = rng.choice(sorted(state))
    t = state[name]
    op = rng.randrange(18)
    if op == 0:
        t.add_(1.0) if t.is_floating_point() else t.add_(1)
    elif op == 1 and t.numel():  # one element through .data
        t.data.view(-1)[rng.randrange(t.numel())] += 3
    elif op == 2:  # new memory of the same shape and dtype
        t.data = torch.randn(t.shape).to(t.dtype)
    elif op == 3:  # another shape
        t.data = torch.randn(rng.randrange(1, 5), 3).to(t.dtype)
    elif op == 4:  # (refused once numpy viewed its storage, as a commit does)
        t.resize_(rng.randrange(0, t.numel() + 1))
    elif op == 5:  # pointed at another tensor's storage (a tie, or a shifted view)
        other = rng.choice(pool)
        n = rng.randrange(0, 3)
        fits = other.untyped_storage().nbytes() // t.element_size()  # (set_ does not check)
        t.set_(other.untyped_storage(), n, (max(0, fits - n),), (1,))
        if t.dtype != other.dtype:
            state[name] = other[n:]
    elif op == 6 and t.dim() == 2:
        t.t_()  # strides change, memory does not
    elif op == 7:
        t.unsqueeze_(0)
    elif op == 8:  # the same memory in another tensor object (as state_dict() gives)
        state[name] = t.detach()
    elif op == 9 and t.is_floating_point():
        state[name] = t.detach().requires_grad_(True)
    elif op == 10:
        state[name] = t.to(torch.float64 if t.dtype == torch.float32 else torch.float32)
    elif op == 11 and t.is_floating_point():  # a negated view of the same memory
        state[name] = t.detach()._neg_view()
    elif op == 12:  # the same tensor under a second name (tied)
        state[f"tie{rng.randrange(3)}"] = t
    elif op == 13 and t.numel() > 1:  # a view at an offset into the same storage
        state[name] = t.view(-1)[1:]
    elif op == 14:
        state[name] = torch.randn(3, 4)
    elif op == 15 and len(state) > 1:
        del state[name]
    elif op == 16 and t.is_contiguous() and t.dim() != 1:  # the same bytes, another shape
        state[name] = t.view(-1)
    elif op == 17 and t.dtype in _SAME_SIZE:  # the same bytes as another dtype
        state[name] = t.view(_SAME_SIZE[t.dtype])


_SAME_SIZE = {torch.float32: torch.int32, torch.int32: torch.float32,
              torch.float64: torch.int64, torch.int64: torch.float64}


@pytest.mark.parametrize("seed", range(40))
def test_a_split_with_the_memo_is_the_plain_split(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    pool = [torch.randn(24), torch.arange(30, dtype=torch.int64), torch.randn(6, 4)]
    state = {"a.weight": torch.randn(4, 3), "a.bias": torch.randn(3),
             "b": torch.arange(12, dtype=torch.int32), "c": pool[0]}
    memo = ViewMemo()
    for _ in range(25):
        _check(state, memo)
        _mutate(rng, state, pool)
    _check(state, memo)


def test_memo_records_only_viewable_tensors_and_drops_vanished_names():
    memo = ViewMemo()
    state = {"w": torch.randn(3), "t": torch.randn(3, 4).t(), "c": torch.randn(2, dtype=
             torch.complex64), "e": torch.empty(0), "i": torch.ones(2, dtype=torch.int16)}
    _check(state, memo)
    assert set(memo.now) == {"w", "i"}  # transposed, complex, empty: copied each time
    del state["w"]
    _check(state, memo)
    assert set(memo.now) == {"i"}


@pytest.mark.parametrize("seed", range(8))
def test_commits_through_the_memo_store_the_plain_manifests(tmp_path, seed):
    """The same sequence committed by one repository object (memo warm) and, step by
    step, by fresh ones (memo cold) gives the same manifests: nothing is missed."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    Repo.init(tmp_path / "warm")
    Repo.init(tmp_path / "cold")
    warm = Repo(tmp_path / "warm")
    pool = [torch.randn(24), torch.randn(6, 4)]
    state = {"a.weight": torch.randn(4, 3), "a.bias": torch.randn(3), "c": pool[0]}
    t = "2026-01-01T00:00:00.000000Z"
    for i in range(12):
        a = warm.commit(state, env=False, allow_empty=True, time=t, author="x", message=str(i))
        b = Repo(tmp_path / "cold").commit(state, env=False, allow_empty=True, time=t,
                                            author="x", message=str(i))
        assert warm.read_commit(a).manifest == Repo(tmp_path / "cold").read_commit(b).manifest
        _mutate(rng, state, pool)
        for name, value in state.items():  # (a negated view is not committable at all)
            if value.is_neg():
                state[name] = value.resolve_neg()


def test_a_data_write_of_one_element_is_committed(repo):
    state = {"w": torch.zeros(8, 8), "b": torch.zeros(8)}
    first = repo.commit(state, env=False)
    state["w"].data[7, 3] += 0.5
    second = repo.commit(state, env=False)
    assert repo.load(second)["w"][7, 3] == 0.5 and first != second


def test_a_tensor_grown_in_place_is_committed_whole(repo):
    w = torch.zeros(4)
    state = {"w": w}
    repo.commit(state, env=False)
    w.resize_(1 << 16).fill_(2.0)  # (new, bigger memory for the same tensor object)
    repo.commit(state, env=False)
    loaded = repo.load()["w"]
    assert loaded.shape == (1 << 16,) and bool((loaded == 2.0).all())
    w.set_(torch.full((1 << 15,), 3.0).untyped_storage())  # re-pointed, then smaller
    repo.commit(state, env=False)
    assert repo.load()["w"].shape == (1 << 15,) and bool((repo.load()["w"] == 3.0).all())
    w.set_(torch.ones(3).untyped_storage())  # re-pointed at other memory
    repo.commit(state, env=False)
    assert repo.load()["w"].tolist() == [1.0, 1.0, 1.0]


def test_the_short_way_for_a_flat_dict_follows_its_keys_and_values():
    memo = ViewMemo()
    w, b = torch.randn(3), torch.randn(2)
    states = [{"w": w, "b": b}, {"w": w, "b": b}, {"b": b, "w": w},  # another order
              {"w": w, "b": b, "lr": 0.1},  # a value that is no tensor
              {"w": w, "b": b}, {"w": w, "b": b.numpy()},  # an array
              {"w": w, "b": b}, {"w": w, "b": w},  # tied
              {"w": w, "b": w.detach()}, {"w": w, "": b}, {"w": w, "tensor": b, "": b},
              {"w": torch.randn(3).to_sparse(), "b": b}]
    for state in states:
        try:
            expected = flatten(state)
        except Exception as exc:  # (the sparse tensor: refused either way)
            with pytest.raises(type(exc)):
                flatten(state, memo)
            continue
        got = flatten(state, memo)
        assert got == expected and repr(got[1]) == repr(expected[1])
        assert [k for k in got[0]] == [k for k in expected[0]]


def test_the_memo_keeps_only_small_tensors_alive(monkeypatch):
    import vrl.tensors as tensors_module

    monkeypatch.setattr(tensors_module, "MEMO_BYTES", 100)
    memo = ViewMemo()
    state = {"big": torch.zeros((1 << 20) // 4 + 1), "a": torch.zeros(16), "b": torch.zeros(16),
             "c": torch.zeros(16)}
    _check(state, memo)
    assert set(memo.now) == {"a", "b"}  # over the size limit; then over the byte budget
    _check(state, memo)


def test_the_same_bytes_as_another_shape_or_dtype_get_an_entry_of_their_own(repo):
    """A tensor whose bytes did not change is recognised by them (no hash, no lookup),
    but only with its dtype and shape as well: the same bytes viewed otherwise are a new
    entry (a commit that took the old one would find nothing changed)."""
    w = torch.arange(12, dtype=torch.float32)
    state = {"w": w, "b": torch.ones(2)}
    repo.commit(state, env=False)
    for value in (w.view(3, 4), w.view(torch.int32).view(3, 4), w.view(torch.int32), w):
        state["w"] = value
        cid = repo.commit(state, env=False)
        entry = repo.read_manifest(repo.read_commit(cid).manifest).tensors["w"]
        assert (entry.dtype, tuple(entry.shape)) == (str(value.dtype)[6:], tuple(value.shape))
        assert torch.equal(repo.load(cid)["w"], value)
