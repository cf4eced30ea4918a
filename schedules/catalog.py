"""The catalog of kernel kinds: every card (``card.py``) in the order of the rules that build
them, the first card that claims a group being its kind.

This is the one place that says which kernel a fused group becomes: the features ask it
(``GroupFeatures.card_on``), and the analytical and learned cost models read the card it
returns. Adding a kernel kind means a rule and its card beside it, then one line here, in the
place of its rule in ``cpu.rules()``.
"""

from __future__ import annotations

from typing import Any

from .attention import ATTENTION_CARD
from .card import Card
from .chain import CHAIN_CARD
from .classes import ScheduleClass
from .contraction import CONTRACTION_CARD, STREAM_CARD
from .cpu import ELEMENTWISE_CARD, FALLBACK_CARD
from .reduction import REDUCTION_CARD

__all__ = ["CARDS", "card_of", "claim", "target_kind"]

#: The rules' order (``cpu.rules()``): ChannelChain, Contraction, Attention, RowReduction,
#: Fallback.
CARDS: tuple[Card, ...] = (CHAIN_CARD, CONTRACTION_CARD, STREAM_CARD, ATTENTION_CARD,
                           REDUCTION_CARD, ELEMENTWISE_CARD, FALLBACK_CARD)
_BY_CLASS = {card.cls: card for card in CARDS}


def target_kind(kind: str) -> str:
    """``"cuda"`` or ``"cpu"``: the cards' name for a target kind (any non-CUDA one is a CPU)."""
    return "cuda" if kind == "cuda" else "cpu"


def claim(features: Any, kind: str) -> Card:
    """The card of the kernel a group with ``features`` becomes on a ``kind`` target."""
    kind = target_kind(kind)
    for card in CARDS:
        if kind in card.efficiency and card.claims(features, kind):
            return card
    raise RuntimeError("no card claimed the group; the fallback card claims every one")


def card_of(cls: ScheduleClass | str) -> Card:
    """The card of a schedule class."""
    return _BY_CLASS[ScheduleClass(cls)]
