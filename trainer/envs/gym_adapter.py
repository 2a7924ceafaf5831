"""Any Gymnasium environment as a :class:`~trainer.envs.base.VecEnv`.

Uses a synchronous vector env in same-step autoreset mode, so a finished sub-env's last
observation arrives in ``info["final_obs"]`` together with the terminated/truncated
flags of that very step; the trainer bootstraps truncated steps with V(final_obs).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def _import_gym():
    try:
        import gymnasium
    except ImportError as exc:
        raise ImportError("Gymnasium environments need gymnasium: "
                          "pip install 'vrl[gym]'") from exc
    return gymnasium


class GymVecEnv:
    """``num_envs`` copies of a Gymnasium env with a Box observation and Discrete actions."""

    def __init__(self, env_id: str, num_envs: int = 4, device: str | torch.device = "cpu",
                 **env_kwargs: Any) -> None:
        gym = _import_gym()
        self.env_id = env_id
        self.device = torch.device(device)
        self.envs = gym.make_vec(
            env_id, num_envs=num_envs, vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}, **env_kwargs)
        obs_space, act_space = self.envs.single_observation_space, self.envs.single_action_space
        if not isinstance(act_space, gym.spaces.Discrete):
            raise ValueError(f"{env_id}: only Discrete action spaces are supported, "
                             f"got {act_space}")
        self.num_envs = num_envs
        self.obs_dim = int(np.prod(obs_space.shape))
        self.num_actions = int(act_space.n)
        self._returns = np.zeros(num_envs)
        self._lengths = np.zeros(num_envs, dtype=np.int64)

    def _tensor(self, obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(obs, dtype=np.float32).reshape(self.num_envs, -1),
                               device=self.device)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        obs, _ = self.envs.reset(seed=seed)
        self._returns[:] = 0
        self._lengths[:] = 0
        return self._tensor(obs)

    def step(self, actions: torch.Tensor):
        obs, reward, terminated, truncated, info = self.envs.step(actions.cpu().numpy())
        self._returns += reward
        self._lengths += 1
        done = terminated | truncated
        out: dict[str, Any] = {}
        if done.any():
            final = np.asarray(obs, dtype=np.float32).reshape(self.num_envs, -1).copy()
            for i in np.flatnonzero(info.get("_final_obs", done)):
                final[i] = np.asarray(info["final_obs"][i], dtype=np.float32).reshape(-1)
            out["final_obs"] = torch.as_tensor(final, device=self.device)
            out["episodes"] = [{"return": float(self._returns[i]),
                                "length": float(self._lengths[i])}
                               for i in np.flatnonzero(done)]
            self._returns[done] = 0
            self._lengths[done] = 0
        return (self._tensor(obs), torch.as_tensor(reward, dtype=torch.float32,
                                                   device=self.device),
                torch.as_tensor(terminated, device=self.device),
                torch.as_tensor(truncated, device=self.device), out)

    def close(self) -> None:
        self.envs.close()
