"""The global RNG states in a snapshot: both stored forms (the Snapshotter's and the
trainer's) keep their skeleton, and either restores the draws after a commit and a load."""

import random

import numpy as np
import pytest
import torch

from vrl.rng import rng_state, set_rng_state


def draws():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_the_snapshotter_form_is_what_random_and_numpy_give():
    state = rng_state()
    assert isinstance(state["python"], tuple) and state["python"] == random.getstate()
    name, keys, pos, has_gauss, cached = state["numpy"]
    assert isinstance(state["numpy"], tuple) and name == "MT19937"
    assert isinstance(keys, np.ndarray) and keys.dtype == np.uint32 and keys.shape == (624,)
    assert torch.equal(state["torch"], torch.get_rng_state())


def test_the_tensor_form_holds_only_tensors_and_json_values():
    state = rng_state(tensors=True)
    version, internal, gauss = state["python"]
    assert isinstance(state["python"], list) and isinstance(internal, list)
    assert (version, tuple(internal), gauss) == random.getstate()
    numpy_state = state["numpy"]
    assert set(numpy_state) == {"name", "keys", "pos", "has_gauss", "cached"}
    assert numpy_state["keys"].dtype == torch.int64 and numpy_state["keys"].shape == (624,)
    assert [type(numpy_state[k]) for k in ("pos", "has_gauss", "cached")] == [int, int, float]
    assert torch.equal(state["torch"], torch.get_rng_state())


@pytest.mark.parametrize("tensors", [False, True], ids=["snapshotter", "trainer"])
def test_either_form_restores_the_draws_after_a_commit_and_a_load(repo, tensors):
    cid = repo.commit({"rng": rng_state(tensors=tensors)}, env=False)
    expected = draws()
    set_rng_state(repo.load(cid)["rng"])
    assert draws() == expected


def test_numpy_keys_exported_as_a_tensor_still_restore():
    """A `.pt` export turns the Snapshotter form's numpy keys into a tensor."""
    state = rng_state()
    name, keys, *rest = state["numpy"]
    state["numpy"] = (name, torch.from_numpy(keys.astype(np.int64)), *rest)
    expected = draws()
    set_rng_state(state)
    assert draws() == expected
