"""Changes applied to a model for a run (activation checkpointing, AMP), each undoable."""
