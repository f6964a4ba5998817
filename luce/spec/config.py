"""Speculation options, named as users of Luce DFlash know them, and the drafter factory.

    --spec off|chain|ddtree|specla   --draft PATH   --draft-kind dflash|model|ngram
    --ddtree-budget 22   --ddtree-tau 6   --spec-top-k 4   --draft-vocab 32768

Depth: with `draft_min` set (luce-serve's default: 0), each step drafts the depth in [draft_min,
chain_depth] that measurably gives the most tokens per second (luce.spec.depth), or none (plain
decoding) where that is faster: no draft shorter than draft_min (llama-server's --draft-min).
`draft_min` None: always chain_depth.

Modes (every one is lossless: output equals `off` for greedy and seeded sampling):
- chain: the drafter's top-1 chain, verified as tree rows (GDN layers by factor capture);
- ddtree: a DDTree (best-first under `ddtree_budget` drafted nodes, `spec_top_k` siblings,
  `ddtree_tau` pruning) verified with per-node stored GDN states (Luce DFlash's way);
- specla: the same DDTree verified by factor capture (DESIGN 3), which keeps O(H D) per
  node instead of a full state (the mode this project is named for).
The DFlash draft's block size (its metadata) caps the depth; the other drafters draft
`chain_depth` tokens deep.
"""
from __future__ import annotations

from dataclasses import dataclass

MODES = ("off", "chain", "ddtree", "specla")
DRAFT_KINDS = ("dflash", "model", "ngram")
DRAFT_VOCAB = 32768   # a draft model scores ids below this (luce.spec.drafters.draft_model); 0: all
GDN_TREE_MODE = {"chain": "factor", "ddtree": "baseline", "specla": "factor"}


class SpecConfigError(ValueError):
    """An impossible combination of speculation options."""


@dataclass(frozen=True)
class SpecConfig:
    spec: str = "off"
    draft_kind: str = "dflash"
    draft: str | None = None          # draft GGUF (dflash, model)
    ddtree_budget: int = 22
    ddtree_tau: float = 6.0
    spec_top_k: int = 4
    chain_depth: int = 8              # model / n-gram drafts; DFlash: block size - 1
    ngram_max: int = 4                # n-gram drafter: longest suffix looked up
    draft_min: int | None = None      # adaptive depth: 0 (plain) or [draft_min, chain_depth]
                                      # (luce.spec.depth); None: always chain_depth
    draft_vocab: int = DRAFT_VOCAB    # a draft model proposes ids below this (0: the whole vocabulary)

    def __post_init__(self):
        if self.spec not in MODES:
            raise SpecConfigError(f"--spec must be one of {', '.join(MODES)}, got {self.spec!r}")
        if self.draft_kind not in DRAFT_KINDS:
            raise SpecConfigError(f"--draft-kind must be one of {', '.join(DRAFT_KINDS)}, got {self.draft_kind!r}")
        if self.ddtree_budget < 1:
            raise SpecConfigError(f"--ddtree-budget must be >= 1, got {self.ddtree_budget}")
        if self.ddtree_tau < 0:
            raise SpecConfigError(f"--ddtree-tau must be >= 0, got {self.ddtree_tau}")
        if self.spec_top_k < 1:
            raise SpecConfigError(f"--spec-top-k must be >= 1, got {self.spec_top_k}")
        if self.chain_depth < 1:
            raise SpecConfigError(f"chain depth must be >= 1, got {self.chain_depth}")
        if self.draft_min is not None and not 0 <= self.draft_min <= self.chain_depth:
            raise SpecConfigError(f"--draft-min must be in 0..--draft-max ({self.chain_depth}), got {self.draft_min}")
        if self.draft_vocab < 0:
            raise SpecConfigError(f"--draft-vocab must be >= 0 (0: the whole vocabulary), got {self.draft_vocab}")
        if self.enabled and self.draft_kind in ("dflash", "model") and not self.draft:
            raise SpecConfigError(f"--draft-kind {self.draft_kind} needs a draft model: pass --draft PATH "
                                  "(or use --draft-kind ngram, which needs none)")

    @property
    def enabled(self) -> bool:
        return self.spec != "off"

    @property
    def uses_tree(self) -> bool:
        return self.spec in ("ddtree", "specla")

    @property
    def gdn_tree_mode(self) -> str:
        """How hybrid targets verify GDN layers on tree rows (luce.ops.api.TREE_MODES: gdn_step)."""
        return GDN_TREE_MODE.get(self.spec, "factor")

    def notes_for(self, target_config) -> list[str]:
        """Warnings for a target (not errors): e.g. specla on a model without GDN layers."""
        notes = []
        if self.spec == "specla" and not getattr(target_config, "gdn_layers", ()):
            notes.append("--spec specla on a model with no Gated DeltaNet layers: factor capture has "
                         "nothing to do, so it only differs from ddtree in name (attention rows only)")
        return notes


def make_drafter(config: SpecConfig, target, max_slots: int, ctx: int, draft_model=None):
    """The drafter `config` names, for `target` (a luce model). draft_model: an already
    loaded draft (tests); otherwise config.draft is loaded on the target's backend."""
    from luce.spec.drafters import DFlashDrafter, DraftModelDrafter, NgramDrafter

    if not config.enabled:
        return None
    if config.draft_kind == "ngram":
        return NgramDrafter(max_ngram=config.ngram_max, max_depth=config.chain_depth)
    if draft_model is None:
        from luce.gguf.reader import read_config
        from luce.models.loader import load_model

        arch = read_config(config.draft).arch
        _check_draft_arch(config, arch)
        kwargs = {"target_model": target} if arch == "dflash" else {}
        draft_model = load_model(config.draft, target.backend, **kwargs)
    _check_draft_arch(config, draft_model.config.arch)
    if config.draft_kind == "dflash":
        return DFlashDrafter(draft_model, max_slots, ctx)
    return DraftModelDrafter(draft_model, max_slots, ctx, max_depth=config.chain_depth,
                             target_vocab=target.config.vocab, head_vocab=config.draft_vocab or None)


def resolve_spec_config(spec: str | None = None, draft=None, draft_kind: str | None = None,
                        **options) -> SpecConfig:
    """The SpecConfig a user means, as llama-server reads its flags: a draft (or a drafter
    kind) without --spec speculates in chain mode; the drafter kind defaults to what the
    draft file is (a 'dflash' GGUF: dflash, else model) and to ngram without a draft.
    options: ddtree_budget, ddtree_tau, spec_top_k, chain_depth, ngram_max, draft_min, draft_vocab."""
    mode = spec if spec is not None else ("chain" if draft is not None or draft_kind is not None else "off")
    if draft_kind is None:
        if draft is None:
            draft_kind = "ngram" if mode != "off" else "dflash"
        else:
            from luce.gguf.reader import read_config

            draft_kind = "dflash" if read_config(draft).arch == "dflash" else "model"
    return SpecConfig(spec=mode, draft_kind=draft_kind, draft=None if draft is None else str(draft), **options)


def _check_draft_arch(config: SpecConfig, arch: str) -> None:
    if config.draft_kind == "dflash" and arch != "dflash":
        raise SpecConfigError(f"--draft-kind dflash needs a DFlash draft (GGUF arch 'dflash'), "
                              f"{config.draft} is {arch!r}: use --draft-kind model for a plain model")
    if config.draft_kind == "model" and arch == "dflash":
        raise SpecConfigError("--draft-kind model got a DFlash draft: use --draft-kind dflash")
