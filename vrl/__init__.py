"""vrl - Versioned Reinforcement Learning: a Git-like store for policy snapshots."""

from vrl.errors import VrlError
from vrl.repo import Repo

__all__ = ["Repo", "VrlError"]
__version__ = "0.1.0"
