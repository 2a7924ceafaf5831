import numpy as np
import pytest
import torch

from trainer.envs.baseline import run_baseline
from trainer.envs.layouts import Layout, warehouse_layout
from trainer.envs.warehouse import WarehouseEnv

STAY, UP, DOWN, LEFT, RIGHT = range(5)
# cells: row 0 = 0..4, row 1 = 5..9 (6 and 8 shelves), row 2 = 10..14
SMALL = ["P....",
         ".#.#.",
         "....D"]
REWARDS = dict(step_cost=-0.01, pickup_reward=0.5, delivery_reward=1.0,
               collision_penalty=-0.1, wall_penalty=-0.05)


def make(n, positions, targets=None, loaded=None, layout=SMALL, **kw):
    env = WarehouseEnv(1, num_agents=n, layout=layout, view_radius=1, **{**REWARDS, **kw})
    env.reset(seed=0)
    env.pos = torch.tensor([positions])
    env.target = torch.tensor([targets or [0] * n])
    env.loaded = torch.tensor([loaded or [False] * n])
    return env


def step(env, actions):
    return env.step(torch.tensor(actions))


def test_shelves_walls_and_edges_block():
    env = make(2, [1, 4])
    _, reward, *_ = step(env, [DOWN, UP])
    assert env.pos.tolist() == [[1, 4]]
    assert env.ep_wall_bumps.item() == 2 and env.ep_collisions.item() == 0
    assert reward.tolist() == pytest.approx([-0.06, -0.06])


def test_vertex_conflict_lowest_index_wins():
    env = make(2, [1, 3])
    _, reward, *_ = step(env, [RIGHT, LEFT])
    assert env.pos.tolist() == [[2, 3]]
    assert env.ep_collisions.item() == 1
    assert reward.tolist() == pytest.approx([-0.01, -0.11])
    env = make(2, [3, 1])
    step(env, [LEFT, RIGHT])
    assert env.pos.tolist() == [[2, 1]]


def test_cannot_enter_a_cell_whose_agv_stays():
    env = make(2, [2, 3])
    step(env, [STAY, LEFT])
    assert env.pos.tolist() == [[2, 3]]
    assert env.ep_collisions.item() == 1


def test_swap_conflict_blocks_both():
    env = make(2, [1, 2])
    step(env, [RIGHT, LEFT])
    assert env.pos.tolist() == [[1, 2]]
    assert env.ep_collisions.item() == 2


def test_following_is_allowed():
    env = make(2, [1, 2])
    step(env, [RIGHT, RIGHT])
    assert env.pos.tolist() == [[2, 3]]
    assert env.ep_collisions.item() == 0


def test_blocked_leader_blocks_the_chain():
    env = make(3, [2, 3, 4])
    step(env, [RIGHT, RIGHT, RIGHT])  # the leader hits the east edge
    assert env.pos.tolist() == [[2, 3, 4]]
    assert env.ep_wall_bumps.item() == 1 and env.ep_collisions.item() == 2


def test_rotation_of_four_is_allowed():
    env = make(4, [0, 1, 3, 2], layout=["P.", ".D"])
    step(env, [RIGHT, DOWN, LEFT, UP])
    assert env.pos.tolist() == [[1, 3, 2, 0]]


def test_pickup_then_delivery():
    env = make(1, [1], targets=[0])
    _, reward, *_ = step(env, [LEFT])
    assert env.loaded.tolist() == [[True]] and env.target.tolist() == [[1]]  # the D station
    assert reward.item() == pytest.approx(0.49)
    env.pos = torch.tensor([[13]])
    _, reward, *_ = step(env, [RIGHT])
    assert env.loaded.tolist() == [[False]] and env.target.tolist() == [[0]]
    assert reward.item() == pytest.approx(0.99)
    assert env.ep_deliveries.item() == 1


def test_time_limit_truncates_and_resets():
    env = make(2, [1, 3], max_steps=3)
    for _ in range(2):
        _, _, term, trunc, info = step(env, [STAY, STAY])
        assert not trunc.any() and "final_obs" not in info
    before = env.observe()
    obs, _, term, trunc, info = step(env, [STAY, STAY])
    assert trunc.all() and not term.any()
    assert torch.equal(info["final_obs"], before)  # nothing moved in the last step
    assert env.t == 0 and torch.equal(obs, env.observe())
    (ep,) = info["episodes"]
    assert ep["length"] == 3 and ep["return"] == pytest.approx(-0.03)
    _, _, _, trunc, _ = step(env, [STAY, STAY])
    assert not trunc.any()


def test_observation_window_and_goal():
    env = make(2, [2, 7], targets=[0, 1])
    obs = env.observe()
    k = env.window
    assert env.obs_dim == 3 * k + 3 and k == 9
    a0 = obs[0]
    assert a0[:k].tolist() == [1, 1, 1, 0, 0, 0, 1, 0, 1]      # outside, aisle, shelves
    assert a0[k:2 * k].tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 0]  # the AGV below, not itself
    assert a0[2 * k:3 * k].tolist() == [0] * 9                 # target (cell 0) out of view
    assert a0[3 * k:].tolist() == pytest.approx([0.0, -0.4, 0.0])
    a1 = obs[1]                                                # at 7, target D = cell 14
    assert a1[2 * k:3 * k].tolist() == [0] * 9
    assert a1[3 * k:].tolist() == pytest.approx([1 / 3, 2 / 5, 0.0])
    env.pos = torch.tensor([[2, 13]])
    assert env.observe()[1, 2 * k + 5].item() == 1.0           # D just east of 13


def random_rollout(env, seed, steps=40):
    gen = torch.Generator().manual_seed(seed)
    out = [env.reset(seed=seed)]
    for _ in range(steps):
        obs, reward, *_ = env.step(torch.randint(5, (env.num_envs,), generator=gen))
        out += [obs, reward]
    return out


def test_same_seed_same_trajectory():
    a = random_rollout(WarehouseEnv(3, num_agents=6, max_steps=16), seed=3)
    b = random_rollout(WarehouseEnv(3, num_agents=6, max_steps=16), seed=3)
    c = random_rollout(WarehouseEnv(3, num_agents=6, max_steps=16), seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_state_dict_resumes_exactly():
    env = WarehouseEnv(2, num_agents=5, max_steps=12)
    random_rollout(env, seed=1, steps=7)
    state = env.state_dict()
    gen = torch.Generator().manual_seed(9)
    acts = [torch.randint(5, (env.num_envs,), generator=gen) for _ in range(10)]
    first = [env.step(a)[0] for a in acts]
    other = WarehouseEnv(2, num_agents=5, max_steps=12)
    other.load_state_dict(state)
    assert all(torch.equal(x, other.step(a)[0]) for x, a in zip(first, acts, strict=True))


def test_agents_start_on_distinct_free_cells():
    env = WarehouseEnv(16, num_agents=20)
    env.reset(seed=0)
    walls = torch.as_tensor(env.layout.walls.reshape(-1))
    for row in env.pos:
        assert len(set(row.tolist())) == 20
        assert not walls[row].any()


def test_baseline_beats_random_policy():
    env = WarehouseEnv(4, max_steps=128)
    classical = run_baseline(env, seed=0)
    env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    random_eps = []
    while not random_eps:
        *_, info = env.step(torch.randint(5, (env.num_envs,), generator=gen))
        random_eps = info.get("episodes", [])
    mean = lambda eps: sum(e["deliveries"] for e in eps) / len(eps)  # noqa: E731
    assert mean(classical) > 5 * max(mean(random_eps), 1.0)


def test_render_text_and_gif(tmp_path):
    env = make(2, [1, 13], loaded=[False, True])
    assert env.render_text() == "Pa...\n.#.#.\n...BD"
    frame = env.render_rgb(cell_px=4)
    assert frame.shape == (12, 20, 3)
    pytest.importorskip("PIL")
    from trainer.envs.warehouse import save_gif

    save_gif([frame, frame], str(tmp_path / "ep.gif"))
    assert (tmp_path / "ep.gif").read_bytes()[:6] == b"GIF89a"


def test_layouts():
    lay = warehouse_layout()
    assert lay.walls.sum() == 96 and len(lay.pickups) == 24 and len(lay.dropoffs) == 12
    with pytest.raises(ValueError):
        Layout(("P.", "."))
    with pytest.raises(ValueError):
        Layout(("..", ".."))


def test_record_episode(tmp_path):
    pytest.importorskip("PIL")
    from trainer.envs.baseline import ShortestPathPolicy
    from trainer.envs.warehouse import record_episode

    env = WarehouseEnv(1, num_agents=3, max_steps=6)
    policy = ShortestPathPolicy(env)
    texts = record_episode(env, lambda obs: policy.act(), gif_path=str(tmp_path / "a.gif"),
                           png_dir=str(tmp_path / "png"))
    assert len(texts) == 6 and len(list((tmp_path / "png").iterdir())) == 6
    assert texts[0] != texts[-1]  # the AGVs moved


def test_gif_frames_carry_a_title_the_step_and_a_legend(tmp_path):
    pytest.importorskip("PIL")
    from PIL import Image

    from trainer.envs.baseline import ShortestPathPolicy
    from trainer.envs.warehouse import AGV_LOADED, DROPOFF, record_episode

    env = WarehouseEnv(1, num_agents=3, max_steps=6)
    policy = ShortestPathPolicy(env)
    record_episode(env, lambda obs: policy.act(), gif_path=str(tmp_path / "a.gif"),
                   png_dir=str(tmp_path / "png"), title="best/run (0123456789ab)")
    raw = env.render_rgb()
    first, last = (np.asarray(Image.open(tmp_path / "png" / f"frame_{i:04d}.png"))
                   for i in (0, 5))
    assert first.shape[1] == raw.shape[1] and first.shape[0] > raw.shape[0] + 40
    header = first[:26]
    assert (header < 60).all(axis=2).sum() > 50  # black text above the frame
    assert not np.array_equal(header, last[:26])  # the step counter moved
    legend = first[-14:]
    for colour in (DROPOFF, AGV_LOADED):  # every colour explained below it
        assert (legend == colour).all(axis=2).sum() > 20
    with Image.open(tmp_path / "a.gif") as gif:
        assert gif.n_frames == 6 and gif.size == (first.shape[1], first.shape[0])
