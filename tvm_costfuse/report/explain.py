"""``costfuse explain``: a fusion plan with its reasons and cost breakdown.

``explain`` prepares a model, plans it with CostFuse and returns plain, JSON-serialisable data:
every kernel with its ops, predicted time and the terms behind it, every merge the planner
weighed with its verdict, and totals set against TVM's FuseOps partition, the rules-only
partition and no fusion -- all priced by the same cost model, so the differences are the
grouping alone. ``format_text`` prints it as tables and ``draw`` as a picture.
Nothing here changes IR.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tvm

from .. import models
from ..config import FusionConfig, register_config_keys
from ..cost.extract import group_features
from ..cost.features import op_class
from ..fold import fold_weights
from ..graph import OpGraph, build_graph
from ..partition import fuseops_groups, resolve_groups
from ..pipelines import prepare
from ..planner import initial_units, plan_cost
from ..pre_fusion import costfuse_model
from ..rules import rules_groups
from ..targets import TargetDesc, resolve
from ..transform import plan_module


def is_view(graph: OpGraph, unit: Sequence[str]) -> bool:
    """One reshape-like op left alone: TVM makes it a VM view (no kernel, no copy). Several
    reshapes fused together are one kernel of several blocks, which TVM does not rewrite.
    The rule is ``GroupFeatures.is_view``'s, so the cost models and the kernel count agree."""
    return group_features(graph, unit).is_view


def kernels_of(graph: OpGraph, groups: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """Every kernel a partition launches (groups, then ops left alone), members in order; a
    unit of reshapes alone is a view, not a kernel (``is_view``)."""
    units = initial_units(graph, resolve_groups(graph, groups))
    keyed = [tuple(sorted(u, key=lambda n: graph[n].index)) for u in units
             if not is_view(graph, u)]
    return sorted(keyed, key=lambda k: graph[k[0]].index)


def intermediate_bytes(graph: OpGraph, kernels: Sequence[Sequence[str]]) -> int:
    """Bytes of tensors one kernel writes to global memory and another kernel reads.

    A tensor read only by the function's return, or only inside its own kernel, is not
    counted. Reads through a TupleGetItem count against the tuple's producer, and so do reads
    through a view (a reshape left alone: in no kernel of ``kernels_of``), which writes nothing.
    """
    owner = {n: i for i, k in enumerate(kernels) for n in k}

    def readers(name: str):
        for r in graph.consumers.get(name, ()):
            through_tuple = graph[r].kind == "tuple_get_item" and owner.get(r) == owner.get(name)
            through_view = graph[r].kind == "call_tir" and r not in owner and graph[r].view
            if through_tuple or through_view:
                yield from readers(r)
            elif graph[r].kind == "call_tir":
                yield r

    total = 0
    for node in graph.nodes:
        if node.kind == "call_tir" and node.name in owner and any(
            owner.get(r) != owner.get(node.name) for r in readers(node.name)
        ):
            total += node.bytes_written
    return total


def _totals(graph: OpGraph, target: TargetDesc, config: FusionConfig, groups) -> dict:
    kernels = kernels_of(graph, groups)
    return {
        "kernels": len(kernels),
        "predicted_s": plan_cost(graph, target, config, groups),
        "intermediate_bytes": intermediate_bytes(graph, kernels),
    }


def _op(graph: OpGraph, name: str) -> dict:
    node = graph[name]
    return {
        "binding": name,
        "prim_func": node.prim_func,
        "op_class": op_class(node),
        "pattern": node.pattern.name,
    }


def explain(
    model: str | tvm.IRModule,
    target: str | TargetDesc = "host",
    small: bool = False,
    func_name: str = "main",
    fold: bool = True,
    **config,
) -> dict:
    """Plan ``model`` (a zoo name or a Relax IRModule) for ``target`` and say why.

    Parameters
    ----------
    model
        A zoo model name (``small`` picks its test variant) or an IRModule before fusion; it is
        run through ``pipelines.prepare`` either way.
    target
        Anything :func:`tvm_costfuse.targets.resolve` takes: a preset name (``host``, ``h100``,
        ``h200``, ``a100``), a ``tvm.target.Target`` or a ``TargetDesc``.
    fold
        Fold weight-only work first, as the pipelines do (:mod:`tvm_costfuse.fold`).
    config
        ``FusionConfig`` fields (``max_chain_length=8``...); PassContext keys fill the rest.

    Returns
    -------
    dict
        ``model``, ``target``, ``config``; ``groups`` (one per kernel: ops, ``predicted_s``,
        ``breakdown``, ``registers``, ``spill_bytes``, ``schedule``); ``decisions``;
        ``left_to_fuseops`` and ``notes``; ``mismatched`` (groups a search formed that run as
        another kernel than their card priced: ops, the class they are priced as, why;
        ``rule_check``); ``folded`` (weight-only work folded before
        planning, one line per rewritten binding); ``horizontal`` (sibling matmul sets, each
        combined or left apart, with both prices: :mod:`tvm_costfuse.horizontal`); ``layout``
        (whether the depthwise and 1x1 convolutions run channels-last, why, both prices:
        :mod:`tvm_costfuse.layouts`); ``totals`` for ``costfuse``, ``fuseops``, ``rules`` and
        ``none``, each partition of the graph the layout and sibling steps left.
    """
    register_config_keys()
    name = model if isinstance(model, str) else "<module>"
    if isinstance(model, str):
        model, _ = models.load(model, small=small)
    resolved = resolve(target)
    model, folds = fold_weights(model) if fold else (model, [])
    # as the pipeline hands it on
    model, siblings, layout = costfuse_model(model, resolved, fold=False, **config)
    mod = prepare(model, resolved.tvm, fold=False)
    desc = resolved.desc
    cfg = FusionConfig.resolve(**config)
    plan = plan_module(mod, desc, cfg, func_name, compile_target=resolved.tvm)
    graph = build_graph(mod, func_name)
    runs_as = {tuple(g): cls for g, cls, _ in plan.mismatched}  # priced as what runs

    groups = []
    for members, est in sorted(plan.estimates.items(), key=lambda kv: graph[kv[0][0]].index):
        groups.append({
            "ops": [_op(graph, n) for n in members],
            "fused": len(members) > 1,
            "predicted_s": est.seconds,
            "breakdown": dict(est.breakdown),
            "registers": est.registers,
            "spill_bytes": est.spill_bytes,
            "schedule": runs_as.get(tuple(members))
            or group_features(graph, members).schedule_on(desc.kind),
        })
    decisions = [
        {
            "kind": d.kind,
            "left": list(d.left),
            "right": list(d.right),
            "gain_s": d.gain_s if math.isfinite(d.gain_s) else None,  # None: a group no rule
            # schedules (``rule_check``), priced at infinity
            "accepted": d.accepted,
            "reason": d.reason,
        }
        for d in plan.decisions
    ]
    partitions = {
        "costfuse": [list(g) for g in plan.groups],
        "fuseops": fuseops_groups(mod, func_name),
        "rules": rules_groups(graph, cfg),
        "none": [],
    }
    return {
        "model": name + (" (small)" if small and name != "<module>" else ""),
        "target": desc.name,
        "description": desc.source,  # which figures priced the plan: "...+calibrated" or defaults
        "config": {k: v for k, v in vars(cfg).items()},
        "groups": groups,
        "decisions": decisions,
        "left_to_fuseops": [list(g) for g in plan.left_to_fuseops],
        "notes": list(plan.notes),
        "mismatched": [[list(g), cls, why] for g, cls, why in plan.mismatched],
        "folded": [str(f) for f in folds],
        "horizontal": [str(x) for x in siblings],
        "layout": {"channels_last": layout.chosen, "convolutions": layout.convolutions,
                   "why": layout.why, "predicted_s": list(layout.prices or ())},
        "totals": {k: _totals(graph, desc, cfg, g) for k, g in partitions.items()},
        "partitions": partitions,
        "edges": [[p, n.name] for n in graph.nodes for p in graph.producers(n.name)],
        "bindings": [n.name for n in graph.nodes],
    }


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f}"


def format_text(report: dict, max_decisions: int = 40) -> str:
    """The report as readable tables: kernels, decisions, totals."""
    lines = [f"model {report['model']}, target {report['target']} ({report['description']})", ""]
    lines.append(f"{'#':>3} {'pred us':>9} {'launch':>8} {'memory':>8} {'compute':>8} "
                 f"{'spill':>7} {'regs':>5} {'schedule':<11} ops")
    for i, g in enumerate(report["groups"]):
        b = g["breakdown"]
        ops = " ".join(f"{o['binding']}[{o['op_class'][:4]}]" for o in g["ops"])
        lines.append(
            f"{i:>3} {_us(g['predicted_s']):>9} {_us(b.get('launch', 0)):>8} "
            f"{_us(b.get('memory', 0)):>8} {_us(b.get('compute', 0)):>8} "
            f"{_us(b.get('spill', 0)):>7} {g['registers']:>5} {g['schedule']:<11} {ops}"
        )
    decisions = report["decisions"]
    accepted = sum(d["accepted"] for d in decisions)
    lines += ["", f"decisions: {accepted} accepted, {len(decisions) - accepted} rejected"
              + (f" (first {max_decisions} shown)" if len(decisions) > max_decisions else "")]
    for d in decisions[:max_decisions]:
        mark = "+" if d["accepted"] else "-"
        lines.append(f"  {mark} {d['kind']:<10} {'+'.join(d['left'])} <- {'+'.join(d['right'])}"
                     f": gain {_us(d['gain_s']) if d['gain_s'] is not None else '-inf'} us; "
                     f"{d['reason']}")
    for g in report["left_to_fuseops"]:
        lines.append(f"  left to FuseOps: {', '.join(g)}")
    lines += [f"  note: {n}" for n in report["notes"]]
    lines += [f"  folded: {f}" for f in report.get("folded", ())]
    lines += [f"  horizontal: {h}" for h in report.get("horizontal", ())]
    layout = report.get("layout")
    if layout and layout["convolutions"]:
        lines.append(f"  layout: {'channels-last' if layout['channels_last'] else 'as imported'}"
                     f": {layout['why']}")
    lines += ["", f"{'partition':<10} {'kernels':>7} {'pred us':>10} {'intermediate KiB':>17}"]
    for k, t in report["totals"].items():
        lines.append(f"{k:<10} {t['kernels']:>7} {_us(t['predicted_s']):>10} "
                     f"{t['intermediate_bytes'] / 1024:>17.1f}")
    return "\n".join(lines)


def draw(report: dict, path: str) -> str:
    """Save a picture of the fused graph: bindings laid out by topological depth (left to
    right), coloured by CostFuse kernel; grey nodes run alone. Needs matplotlib."""
    import matplotlib  # optional dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = report["bindings"]
    preds: dict[str, list[str]] = {n: [] for n in names}
    for p, c in report["edges"]:
        preds[c].append(p)
    depth: dict[str, int] = {}
    for n in names:  # program order is topological
        depth[n] = 1 + max((depth[p] for p in preds[n]), default=-1)
    rows: dict[int, int] = {}
    pos = {}
    for n in names:
        pos[n] = (depth[n], rows.get(depth[n], 0))
        rows[depth[n]] = rows.get(depth[n], 0) + 1
    fused = [g for g in report["groups"] if g["fused"]]
    cmap = plt.get_cmap("tab20")
    colour = {o["binding"]: cmap(i % 20) for i, g in enumerate(fused) for o in g["ops"]}
    kernel = {o["binding"]: i for i, g in enumerate(report["groups"]) for o in g["ops"]}

    width = max(7.0, 0.8 * (max(depth.values(), default=0) + 1))
    height = max(4.5, 1.1 * max(rows.values(), default=1) + 2.5)
    fig, ax = plt.subplots(figsize=(min(width, 40), min(height, 30)))
    for p, c in report["edges"]:
        (x0, y0), (x1, y1) = pos[p], pos[c]
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops={"arrowstyle": "->", "color": "0.5", "lw": 0.8,
                                "shrinkA": 9, "shrinkB": 9})
    small = len(names) > 60
    for n in names:
        x, y = pos[n]
        ax.scatter([x], [y], s=260, color=colour.get(n, "0.85"), edgecolors="k", zorder=3)
        if n in kernel:
            ax.text(x, y, str(kernel[n]), ha="center", va="center", fontsize=6, zorder=4)
        if not small:
            ax.text(x + 0.05, y + 0.22, n, ha="left", va="top", fontsize=7, rotation=-30,
                    zorder=4)
    t = report["totals"]
    ax.set_title(
        f"{report['model']} on {report['target']}: CostFuse {t['costfuse']['kernels']} kernels, "
        f"FuseOps {t['fuseops']['kernels']}, rules {t['rules']['kernels']}, "
        f"unfused {t['none']['kernels']}",
        fontsize=10,
    )
    ax.set_xlabel("topological depth (numbers: kernel index in the report; grey: alone)")
    ax.set_yticks([])
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylim(max(rows.values(), default=1) - 0.2, -0.6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
