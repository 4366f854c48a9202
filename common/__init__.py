"""Helpers that every package may import: the standard library only (no torch, Hydra or data)."""
