"""Placeholder: Ray runner (see trainer.pbt / trainer.sweep --ray)."""
