"""The one tolerance table for kernel parity: (rtol, atol) per kernel family and dtype path."""

TOLERANCES = {
    "rmsnorm": (1e-5, 1e-6),
}


def tolerance(kernel: str) -> tuple[float, float]:
    return TOLERANCES[kernel]
