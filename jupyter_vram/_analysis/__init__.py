"""Pure functions from a Profile to numbers, groups and trees; no torch, no UI.

Where each module here is tested: tests/INDEX.md.
"""
