"""Which matmul family the DFlash draft's rows take on a GPU backend (DraftRouting, a mixin of
luce.models.dflash.DFlashDraft), read from the environment at load.

No exactness rule binds draft rows (they only propose; acceptance is lossless), so a pass's rows
may be multiplied as prompt rows (the tensor-core prompt GEMM) instead of the decode family's
exact 16-bit activations. Each constant below names the measurement behind its default.
Backends without a prompt-row GEMM ignore the routing; results stay per row (batch-invariant)
either way."""
from __future__ import annotations

import os

# luce_matmul_prefill's tune that splits k over a cluster of blocks (LUCE_PREFILL_TUNE_SPLIT_K in
# cuda/luce_ops_weights.h; no Cython import here: the routing is read on every backend).
SPLIT_K_TUNE = 81

class DraftRouting:
    """Needs `own_weights()` (the draft's matrices, not the target's head), `kv_weights()` (its
    k and v projections), `backend` and `layers[0].attn.wo`. Attributes after `_read_routing`:
    kv_decode_tune, decode_tune, prompt_tune, prompt_gemm (None: by the pass's rows, True / False:
    always / never), prompt_gemm_min_n."""

    # A pass of this many rows or more (two lanes' blocks) takes the prompt GEMM by default: on the
    # H200 (docs/PERF.md session 15, 27B draft) the decode family's tile kernel costs ~2.5 us a row
    # past 16 rows (a 5-lane pass: 14.1 ms) where the prompt GEMM is nearly flat (5.9 ms at 5
    # lanes, but 5.2 ms for one lane's 16 rows against the tile kernel's 3.0).
    PROMPT_GEMM_ROWS = 32
    # With prompt_gemm_min_n, passes of at most this many rows (a C8 pass of 16-row blocks) send
    # their narrower matmuls to the decode family; more rows (a prompt's context) never.
    DECODE_ROWS_MAX = 128
    # prompt_gemm_min_n unless LUCE_DRAFT_PROMPT_GEMM_MIN_N says otherwise ("0": every call of such
    # a pass on the prompt GEMM): PROMPT_GEMM_MIN_N_SPLIT where the backend's prompt GEMM splits k
    # for the draft (PROMPT_TUNE 81 on an H100 / H200: prompt_split_k > 1), else PROMPT_GEMM_MIN_N.
    # Split, the 27B's draft sends q (4,096 rows), out, down, fc and gate|up there and k, v (1,024)
    # stay on the wide-token kernel: on an H100 (docs/PERF.md session 43) the C5 pass 4.15 / 4.54 ->
    # 3.03 / 3.12 ms; k and v too (0) even. Unsplit (one chain a block: 27 blocks for a 5,120-row
    # matrix) the narrower calls lose there (session 41: 4,096 / 1,024 / 0 gave 4.57-4.67 ms against
    # 4.03 at 8,192).
    PROMPT_GEMM_MIN_N = 8192
    PROMPT_GEMM_MIN_N_SPLIT = 4096
    # The k and v projections' decode calls of 17+ rows take the wide-token kernel's cluster form
    # (tune 15), not the tile kernel tune 0 gives matrices under 2^24 weights: the 27B's draft on an
    # H100 (docs/PERF.md session 35), C3 / C4 passes 3.39-3.44 / 3.56-3.61 ms against 3.46-3.51 /
    # 3.65-3.68, C5 even. Library-wide it loses (the Coders' verify). LUCE_DRAFT_KV_TUNE (at load)
    # sets another tune; 0: the library's choice.
    KV_DECODE_TUNE = 15
    # The same for the draft's other matrices (q, out, gate|up, down, fc) where they take the decode
    # family: LUCE_DRAFT_DECODE_TUNE (at load); 0, the library's choice, until measured otherwise.
    # The 27B draft's q, out, down and fc have 2^24+ weights, so the library's choice at 17+ rows is
    # already 15 (cluster size by rows_auto_cluster); 13 / 14 force clusters of 2 / 4.
    DECODE_TUNE = 0
    # The tune of the own weights' prompt-GEMM calls: LUCE_DRAFT_PROMPT_TUNE (at load; 0: the
    # library's choice). 81: the warpgroup 80- / 48-token tiles with k split over a cluster of blocks
    # (cuda/matmul_prefill_wgmma.cuh), Z by the matrix, which fills the SMs the library's one-chain
    # tiles leave idle at a pass's rows (27 blocks for a 5,120-row matrix): at 80 rows on an H100
    # (session 43) down 197 -> 72 us, out 61 -> 23, q 46 -> 22 against the wide-token kernel the pass
    # ran. Its bits differ from the one chain's, which is why it is the draft's choice (no exactness
    # rule binds draft rows) and not the library's tune 0, which target prefill rows take.
    PROMPT_TUNE = SPLIT_K_TUNE

    def _read_routing(self) -> None:
        """Read at load, after the layers: kv_decode_tune and decode_tune (set on the own
        weights: k and v take kv_decode_tune, the others decode_tune), prompt_tune (all own
        weights' prompt-GEMM calls), prompt_gemm and
        prompt_gemm_min_n. LUCE_DRAFT_PROMPT_GEMM: "1" every pass's rows as prompt rows, "0" none,
        unset: passes of PROMPT_GEMM_ROWS rows or more (spans); LUCE_DRAFT_PROMPT_GEMM_MIN_N
        (default PROMPT_GEMM_MIN_N_SPLIT where the split runs, else PROMPT_GEMM_MIN_N): of those,
        up to DECODE_ROWS_MAX rows, only matmuls this wide
        (the others: the decode family)."""
        self.kv_decode_tune = _tune("LUCE_DRAFT_KV_TUNE", self.KV_DECODE_TUNE)
        self.decode_tune = _tune("LUCE_DRAFT_DECODE_TUNE", self.DECODE_TUNE)
        self.prompt_tune = _tune("LUCE_DRAFT_PROMPT_TUNE", self.PROMPT_TUNE)
        kv = {id(w) for w in self.kv_weights()}
        for w in self.own_weights():
            if hasattr(w, "decode_tune"):   # a GPU weight
                w.decode_tune = self.kv_decode_tune if id(w) in kv else self.decode_tune
                w.prompt_tune = self.prompt_tune
        self.prompt_gemm = env_switch("LUCE_DRAFT_PROMPT_GEMM", "every pass's rows as prompt rows", "none")
        min_n = os.environ.get("LUCE_DRAFT_PROMPT_GEMM_MIN_N", "") or str(
            self.PROMPT_GEMM_MIN_N_SPLIT if self._prompt_gemm_splits() else self.PROMPT_GEMM_MIN_N)
        if not min_n.isdigit():
            raise ValueError(f"LUCE_DRAFT_PROMPT_GEMM_MIN_N={min_n!r}: give a number of output rows "
                             "(e.g. 8192), or unset it")
        self.prompt_gemm_min_n = int(min_n)

    def _prompt_gemm_splits(self) -> bool:
        """Whether this draft's prompt-GEMM calls split k here: prompt_tune 81 on a backend whose
        prompt GEMM splits it for the draft's first out projection (luce_matmul_prefill_split_k)."""
        split_k = getattr(self.backend, "prompt_split_k", None)
        return self.prompt_tune == SPLIT_K_TUNE and split_k is not None and split_k(self.layers[0].attn.wo) > 1

    def spans(self, rows: int, weights) -> tuple[tuple[int, int], ...]:
        """The prefill_spans of one matmul call of the draft, over `weights`, of `rows` rows: the
        whole call as prompt rows for passes of PROMPT_GEMM_ROWS rows or more (`prompt_gemm`
        True / False: always / never). With `prompt_gemm_min_n`, a pass of up to DECODE_ROWS_MAX
        rows keeps a call whose weights have fewer output rows in all on the decode family (its
        wide-token kernel fills the SMs where the prompt GEMM's few blocks do not)."""
        if self.prompt_gemm is not None:
            on = self.prompt_gemm
        else:
            width = sum(int(w.shape[0]) for w in weights)
            on = rows >= self.PROMPT_GEMM_ROWS and (rows > self.DECODE_ROWS_MAX or width >= self.prompt_gemm_min_n)
        return ((0, rows),) if on and rows > 0 else ()


def _tune(name: str, default: int) -> int:
    """A luce_matmul tune from the environment (unset: default)."""
    tune = os.environ.get(name, "") or str(default)
    if not tune.isdigit():
        raise ValueError(f"{name}={tune!r}: give a luce_matmul tune (0: the library's choice), or unset it")
    return int(tune)


def env_switch(name: str, on: str, off: str) -> bool | None:
    """An on / off switch read at load: None unset, True for "1", False for "0"; other values named."""
    value = os.environ.get(name, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{name}={value!r}: give 1 ({on}), 0 ({off}), or unset it")
    return None if value == "" else value == "1"
