"""The Snapshotter's exact change detection compares held copies byte for byte with the
C library's memcmp (torch.equal on bytes cost ~20x more, in the training loop): a single
flipped byte anywhere, a -0.0 for a 0.0 or another NaN payload is still a change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vrl import Repo
from vrl.bytecheck import _memcmp, _same_bytes
from vrl.snapshotter import Snapshotter


def test_same_bytes_by_memcmp_finds_every_flipped_byte(monkeypatch):
    if _memcmp() is None:
        pytest.skip("no C library memcmp here")
    monkeypatch.setattr(torch, "equal", lambda *a: pytest.fail("torch.equal was used"))
    live = torch.randn(300, 301)
    held = live.reshape(-1).view(torch.uint8).clone()
    assert _same_bytes(live, held)
    for at in (0, 1, held.numel() // 2, held.numel() - 1):
        flipped = held.clone()
        flipped[at] ^= 1
        assert not _same_bytes(live, flipped), at
    zero = torch.zeros(4)
    assert not _same_bytes(-zero, zero.view(torch.uint8))  # -0.0 == 0.0, not the same bytes
    nan = torch.tensor([float("nan")])
    other = nan.view(torch.int32).clone()
    other ^= 1  # another NaN payload
    assert not _same_bytes(other.view(torch.float32), nan.view(torch.uint8))
    arr = np.arange(10, dtype=np.float32)
    assert _same_bytes(arr, torch.from_numpy(arr.view(np.uint8).copy()))
    assert not _same_bytes(arr[:9], torch.from_numpy(arr.view(np.uint8).copy()))  # size
    strided = torch.randn(20, 20)[:, ::2]  # not contiguous: compared through a copy
    assert _same_bytes(strided, strided.contiguous().reshape(-1).view(torch.uint8).clone())


@pytest.mark.parametrize("at", [0, 12345, -1])
def test_a_single_byte_written_through_data_is_committed(tmp_path, at):
    repo = Repo.init(tmp_path / "repo")
    model = torch.nn.Linear(400, 300)
    with Snapshotter(repo, model, include_rng=False, env=False, handle_sigterm=False) as snap:
        snap.step(0)
        snap.flush()
        raw = model.weight.data.view(-1).view(torch.uint8)
        raw[at] ^= 0x01  # no version-counter bump: only the byte compare sees it
        snap.step(1)
    got = repo.load("HEAD")["model"]["weight"].view(-1).view(torch.uint8)
    assert torch.equal(got, raw)
    assert repo.load("HEAD~1")["model"]["weight"].view(-1).view(torch.uint8)[at] != raw[at]
