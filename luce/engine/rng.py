"""Counter-based randomness: the draw for a request's token at absolute position n depends only
on (seed, n), so a seeded request samples the same text alone, among others, and with or
without speculation (a verified tree node at position n uses exactly the draw plain decoding
would have used there).

splitmix64 finalizer over (seed, position, stream): pure integer arithmetic, so a GPU sampler
can reproduce it bit for bit.
"""
from __future__ import annotations

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def uniform(seed: int, position: int, stream: int = 0) -> float:
    """A float64 in [0, 1) from the top 53 bits of a hash of (seed, position, stream)."""
    h = splitmix64((seed & MASK64) ^ splitmix64((position & MASK64) ^ splitmix64(stream & MASK64)))
    return (h >> 11) * (1.0 / (1 << 53))
