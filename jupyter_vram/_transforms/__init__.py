"""Changes applied to a model for a run (activation checkpointing, AMP), each undoable.

Where each module here is tested: tests/INDEX.md.
"""
