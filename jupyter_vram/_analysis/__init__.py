"""Pure functions from a Profile to numbers, groups and trees; no torch, no UI."""
