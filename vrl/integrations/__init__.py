"""Integrations of vrl with training frameworks (each module imports its framework lazily)."""
