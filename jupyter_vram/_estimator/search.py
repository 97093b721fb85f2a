"""The largest batch that fits: a search over a monotone, nearly linear memory curve.

Memory grows with the batch almost linearly (activations and temporaries scale, parameters
and optimizer state do not), so a line through two measured points predicts the answer and
one or two more runs confirm it; bisection takes over whenever a prediction misses. Every
point is a real simulated run, so the answer is exact for the simulation, never extrapolated.
"""

from __future__ import annotations

from collections.abc import Callable

#: Batches beyond this are reported as "at least this" (tiny models on big GPUs).
MAX_BATCH = 1 << 16
#: The longest prompt searched for a model whose config gives no position limit.
MAX_CONTEXT = 1 << 22


def largest_fitting(
    used: Callable[[int], int], limit: int, *, start: int = 1, max_batch: int = MAX_BATCH
) -> int:
    """The largest batch ``b`` in [1, max_batch] with ``used(b) <= limit``; 0 if none. (Any
    size memory grows with: the longest-context search passes prompt lengths.)

    ``used`` must be nondecreasing in ``b``; callers cache it, since the same points serve
    several limits.
    """
    if used(1) > limit:
        return 0
    lo = 1  # fits
    hi = max_batch + 1  # known not to fit (or beyond the range)
    guess = max(1, min(start, max_batch))
    while hi - lo > 1:
        guess = min(max(guess, lo + 1), hi - 1)
        if used(guess) <= limit:
            lo = guess
        else:
            hi = guess
        guess = _predict(used, lo, hi, limit, max_batch)
    return lo


def _predict(used: Callable[[int], int], lo: int, hi: int, limit: int, max_batch: int) -> int:
    """The next batch to try: on the line through the nearest known points, else bisect."""
    if hi > max_batch:  # no upper point yet: extrapolate from lo and a smaller point
        base = max(1, lo // 2) if lo > 1 else None
        if base is None or base == lo:
            return lo * 2
        slope = (used(lo) - used(base)) / (lo - base)
        if slope <= 0:
            return lo * 4
        target = lo + int((limit - used(lo)) / slope)
        return max(lo + 1, min(target, lo * 64))
    slope = (used(hi) - used(lo)) / (hi - lo)
    if slope <= 0:
        return (lo + hi) // 2
    target = lo + int((limit - used(lo)) / slope)
    return target if lo < target < hi else (lo + hi) // 2


def format_batch(batch: int) -> str:
    """A search result for people: 0 means nothing fits, the cap means "at least"."""
    if batch == 0:
        return "none (batch 1 does not fit)"
    return f">= {batch:,}" if batch >= MAX_BATCH else f"{batch:,}"


def format_context(tokens: int, new_tokens: int, limit: int) -> str:
    """A longest-context result for people: 0 means nothing fits; the model's own position
    limit is said to be one (the memory would allow more)."""
    if tokens == 0:
        return f"none (a 1-token prompt and {new_tokens:,} new tokens do not fit)"
    text = f"{tokens:,} tokens ({tokens - new_tokens:,} prompt + {new_tokens:,} new)"
    return text + " = the model's position limit" if tokens == limit else text
