"""Kernel-side state: the latest %%vram profile."""

from __future__ import annotations

from .model import Profile

_history: list[Profile] = []


def remember(profile: Profile) -> None:
    _history[:] = [profile]


def last_profile() -> Profile | None:
    """The Profile of the latest `%%vram` run in this kernel (None before the first)."""
    return _history[-1] if _history else None
