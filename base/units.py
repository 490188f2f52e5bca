"""Vocabulary of model units shared by experiments and analysis (pure: no torch, no I/O)."""

OPEN_THRESHOLD = 1e-3
"""A head is open when its test-time gate is above this value (Voita et al. 2019; He & Choi 2021).

The one definition of "open": the experiments count open heads with it, analysis counts them
with it when a run did not report ``open_heads``, and gate maps outline the heads above it."""
