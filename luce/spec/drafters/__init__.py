"""Drafters behind one interface (`luce.spec.drafters.base.Drafter`): n-gram / prompt
lookup, a small draft model sharing the tokenizer, and DFlash."""
from luce.spec.drafters.base import DraftLane, Drafter
from luce.spec.drafters.dflash import DFlashDrafter
from luce.spec.drafters.draft_model import DraftModelDrafter
from luce.spec.drafters.ngram import NgramDrafter

__all__ = ["DraftLane", "Drafter", "DFlashDrafter", "DraftModelDrafter", "NgramDrafter"]
