"""What a stored row says about the workload it was measured on.

A row's ``model`` is ``<name>[@<size>]`` (``tuning`` writes it so); random programs are named
by ``models.synthetic``. The readers (the learned model, the evaluation) ask here, so that
neither knows how workloads are named.
"""

from __future__ import annotations

from ..models.synthetic import PREFIX, is_synthetic

__all__ = ["is_synthetic_row", "row_architecture"]


def row_architecture(row: dict) -> str:
    """The architecture a row was measured on: its ``model`` without the size variant
    (``bert_layer@small`` -> ``bert_layer``); every random program is one (``synth``)."""
    model = row["model"]
    return PREFIX.rstrip("-") if is_synthetic(model) else model.split("@")[0]


def is_synthetic_row(row: dict) -> bool:
    """Whether a row was measured on a random program (``models.synthetic``): the
    evaluation's unseen programs, left out of training unless asked for."""
    return is_synthetic(row["model"])
