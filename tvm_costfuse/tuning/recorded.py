"""The models behind recorded rows, rebuilt by name: what ``refeature`` and ``restamp`` read
a row's group from.

A row names its model (``models.load_variant``) and its members (binding names of the model's
prepared graph). Each model is imported once and prepared as the planner sees it (weights
folded) or, for rows recorded before folding (members such as ``batch_norm`` that folding
removes), unfolded. A model that no longer loads or whose graph fails to build is remembered
with the reason, so that the caller keeps its rows and says why once; a graph that fails
blocks only the rows that need it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm

from .. import models
from ..graph import OpGraph, build_graph
from ..pipelines import prepare
from ..records.database import headline
from ..schedules.prepack import mark_constant_weights

__all__ = ["Prepared", "RecordedModels"]


@dataclass
class Prepared:
    """A model after ``pipelines.prepare``, its op graph, and (on first use) the module with
    its constant weights marked, as ``feedback.measure_model`` forms kernels from it."""

    module: tvm.IRModule
    graph: OpGraph
    _marked: tvm.IRModule | None = field(default=None, repr=False)

    @property
    def marked(self) -> tvm.IRModule:
        if self._marked is None:
            self._marked = mark_constant_weights(self.module)
        return self._marked


class RecordedModels:
    """Prepared models by ``(name, folded)``, built on demand for ``target``."""

    def __init__(self, target: tvm.target.Target) -> None:
        self.target = target
        self._loaded: dict[str, tvm.IRModule] = {}
        self._prepared: dict[tuple[str, bool], Prepared] = {}
        self._built: set[str] = set()
        # why a model (key ``(model, None)``) or one of its graphs (``(model, fold)``) is not
        # there: an unfolded graph that fails must not hide the rows the folded one serves
        self.failed: dict[tuple[str, bool | None], str] = {}

    def prepared(self, model: str, fold: bool) -> Prepared | None:
        key = (model, fold)
        if key in self._prepared or key in self.failed or (model, None) in self.failed:
            return self._prepared.get(key)
        try:
            if model not in self._loaded:
                self._loaded[model] = models.load_variant(model)[0]
        except Exception as err:  # noqa: BLE001 -- its rows are kept; the caller says why
            self.failed[model, None] = "it does not load: " + \
                f"{type(err).__name__}: {headline(str(err))}"[:200]
            return None
        try:
            module = prepare(self._loaded[model], self.target, fold=fold)
            self._prepared[key] = Prepared(module, build_graph(module))
            self._built.add(model)
        except Exception as err:  # noqa: BLE001 -- as above
            self.failed[key] = f"its {'folded' if fold else 'unfolded'} graph does not build: " \
                + f"{type(err).__name__}: {headline(str(err))}"[:200]
        return self._prepared.get(key)

    def for_row(self, model: str, members) -> Prepared | None:
        """The folded model where it has every member, else the unfolded one; None if neither
        (:meth:`why_not` says why)."""
        return next((p for fold in (True, False)
                     if (p := self.prepared(model, fold)) is not None
                     and all(m in p.graph for m in members)), None)

    def why_not(self, model: str, members) -> tuple[str, str]:
        """(key, reason) for a row :meth:`for_row` found no model for: the key is the model
        where the whole model is missing, else the model and the row's members."""
        if (model, None) in self.failed:
            return model, self.failed[model, None]
        causes = [self.failed[model, f] for f in (True, False) if (model, f) in self.failed]
        if len(causes) == 2:  # neither graph builds: one line for the model
            return model, "; ".join(causes)
        return f"{model}: {'+'.join(members)[:60]}", "; ".join(
            ["members not in its graph", *causes])

    def models_built(self) -> int:
        return len(self._built)

    def release(self, model: str) -> None:
        """Free ``model``'s modules (its last row is done); :meth:`models_built` still counts
        it, and asking for it again imports it again."""
        self._loaded.pop(model, None)
        for fold in (True, False):
            self._prepared.pop((model, fold), None)
