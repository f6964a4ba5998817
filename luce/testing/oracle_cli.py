"""Shared by the transformers oracle tools (tools/hf_oracle.py, tools/hf_oracle_dense.py): the
command line that writes one <name>.npz fixture per named config, and capturing decoder-layer
outputs. No torch import here: the tools pass in their models and oracle functions."""
from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np


def fixture_main(argv: Sequence[str] | None, *, description: str, configs: dict, default_out: Path,
                 run_oracle: Callable[[str], dict[str, np.ndarray]],
                 write_gguf: Callable[[str, Path], Path]) -> int:
    """`[--out DIR] [--gguf DIR] [NAME ...]`: DIR/<name>.npz = run_oracle(name) (its arrays
    include 'versions') for each named config of `configs` (default: all); with --gguf also
    write_gguf(name, GGUF_DIR/<name>.gguf), the f32 model (not for committing)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("names", nargs="*", help=f"configs to run (default: all of {list(configs)})")
    ap.add_argument("--out", type=Path, default=default_out, help="directory for <name>.npz")
    ap.add_argument("--gguf", type=Path, help="also write <name>.gguf (f32) here (not for committing)")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in configs]
    if unknown:
        ap.error(f"unknown config(s) {unknown}; known: {list(configs)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or list(configs):
        arrays = run_oracle(name)
        path = args.out / f"{name}.npz"
        np.savez_compressed(path, **arrays)
        print(f"{path}: {path.stat().st_size / 1024:.0f} KiB ({arrays['versions']})")
        if args.gguf:
            args.gguf.mkdir(parents=True, exist_ok=True)
            print(write_gguf(name, args.gguf / f"{name}.gguf"))
    return 0


@contextmanager
def captured_layer_outputs(model, layers: Sequence[int]) -> Iterator[dict[int, np.ndarray]]:
    """While open, {il: [N, H] f32}: the output of decoder layer il of a transformers causal
    LM (model.model.layers) on the latest forward, batch row 0."""
    captured: dict[int, np.ndarray] = {}
    hooks = [model.model.layers[il].register_forward_hook(
        lambda mod, args, out, il=il: captured.__setitem__(
            il, (out[0] if isinstance(out, tuple) else out)[0].detach().float().numpy().copy()))
        for il in layers]
    try:
        yield captured
    finally:
        for hook in hooks:
            hook.remove()
