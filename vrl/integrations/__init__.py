"""Integrations with training libraries, each imported on first use and each importing its
library only when called: `vrl.integrations.sb3` (Stable-Baselines3).
"""
