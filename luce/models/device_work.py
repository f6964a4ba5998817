"""Which of a model's ops its backend would run on the host (DESIGN.md section 9: every mode
the configuration accepts runs on the device, or is refused at start with the reason).

A device backend says, per op and shapes, why it cannot run it (`backend.device_limits(op,
**dims)` -> reason or None); host backends (numpy, cpu) have no such method: everything
they run is host work by design. The engine refuses a model (target or draft) for which
this returns anything.
"""
from __future__ import annotations


def host_work(model) -> list[str]:
    """Reasons [str] `model` would run some op on the host of its device backend ([]: none)."""
    limits = getattr(model.backend, "device_limits", None)
    if limits is None:
        return []
    c, reasons = model.config, []
    layers = getattr(model, "layers", ())
    n_gdn = len(getattr(c, "gdn_layers", ()) or ())
    if c.n_layer - n_gdn > 0:
        why = limits("attention", head_dim=c.head_dim, n_heads=c.n_head, n_kv_heads=c.n_head_kv)
        if why:
            reasons.append(why)
    if n_gdn:
        why = limits("gdn", dk=c.ssm_state_size, dv=c.ssm_state_size)
        if why:
            reasons.append(why)
    if any(getattr(layer, "window", None) is not None for layer in layers):
        why = limits("windowed attention")
        if why:
            reasons.append(why)
    return reasons
