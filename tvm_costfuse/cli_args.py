"""The ``costfuse`` command's arguments: its parser (:func:`build_parser`, one help line on
every argument: ``costfuse <command> --help`` is the reference) and the checks of options that
only together are wrong (:func:`check_tune`). Each value's own check is its ``type=``, in
``cli_types``; the commands themselves are in ``cli``."""

from __future__ import annotations

import argparse
import importlib.metadata

from .cli_types import (
    UsageError,
    budget,
    compare_models,
    config_int,
    csv_choices,
    existing_dir,
    float_in,
    int_at_least,
    model_spec,
    one_model,
    output_dir,
    output_file,
    plot_file,
    rpc_tracker,
    target_spec,
    tune_model,
)
from .config import HORIZONTAL, INT_RANGES, LAYOUTS, FusionConfig
from .report.compare import COMPARED, TARGETS
from .targets import preset_names

__all__ = ["DEMO_MODELS", "DEMO_NOTES", "DESCRIPTION", "build_parser", "check_tune", "version"]

DESCRIPTION = ("costfuse: cost-model-driven operator fusion for Apache TVM (Relax). Compare "
               "its fusion plans with TVM's FuseOps, explain them, and tune its learned cost "
               "model on this machine.")


def version() -> str:
    """The installed distribution's version (pyproject's), or ``unknown`` outside one."""
    try:
        return importlib.metadata.version("tvm_costfuse")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class _Parser(argparse.ArgumentParser):
    """Errors as one line (``costfuse explain: error: argument ...``), exit status 2; the
    usage is one ``--help`` away."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


_MODEL = "model name (see `costfuse models`) or an .onnx / .pt2 file"
# What plain ``costfuse demo`` runs: a zoo model where CostFuse splits what FuseOps fuses
# (FuseOps' one kernel is slower than no fusion there), then a decode step's attention, where
# CostFuse fuses what FuseOps cannot (the KV cache's copies into the attention kernel).
DEMO_MODELS = ("elementwise_chain", "decode_attention")
# What each of ``DEMO_MODELS`` shows: the fusion decision it is about and why it matters.
DEMO_NOTES = {
    "elementwise_chain": "20 elementwise ops. FuseOps fuses them into one kernel whose nested "
                         "math calls stay scalar (slower than no fusion); CostFuse splits it "
                         "where the calls would nest.",
    "decode_attention": "one LLM decode step's attention (Qwen2-0.5B: 14 query heads on 2 KV "
                        "heads, 1024 cached tokens). FuseOps writes the keys and values "
                        "concatenated, repeated over the query heads and transposed as copies "
                        "7x the cache's size before the attention reads them; CostFuse "
                        "computes them inside one attention kernel that reads the cache once.",
}
_SMALL = "the model's small test shapes (seconds to build, not minutes)"


def _caps(parser: argparse.ArgumentParser) -> None:
    """The ``FusionConfig`` caps as options, with the ranges the config itself enforces, and
    the horizontal and layout steps' choices."""
    defaults = FusionConfig()
    for field, what in (("max_chain_length", "longest producer->consumer chain in one group"),
                        ("max_body_ops", "most ops in one group"),
                        ("register_budget", "CUDA registers per thread a fused kernel may use")):
        lo, hi = INT_RANGES[field]
        parser.add_argument(f"--{field.replace('_', '-')}", type=config_int(field),
                            help=f"{what}: costfuse.{field}, {lo}-{hi} "
                                 f"(default {getattr(defaults, field)})")
    parser.add_argument("--horizontal", choices=HORIZONTAL, default=None,
                        help="sibling matmuls of one input as one matmul: where the cost model "
                             "prices it faster (cost), never, or always: costfuse.horizontal "
                             f"(default {defaults.horizontal})")
    parser.add_argument("--layout", choices=LAYOUTS, default=None,
                        help="depthwise and 1x1 convolutions channels-last (NHWC): where the "
                             "cost model prices the model faster so (cost), never, or always: "
                             f"costfuse.layout (default {defaults.layout})")


def build_parser() -> argparse.ArgumentParser:
    """The ``costfuse`` parser; each command sets ``cmd`` to its name (an alias included)."""
    parser = _Parser(prog="costfuse", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="command",
                                help="what to do (each has --help)")
    demo = sub.add_parser("demo", help="compare fusion strategies on a zoo model")
    demo.add_argument("--model", default=None, type=model_spec,
                      help=f"{_MODEL} (default: {', then '.join(DEMO_MODELS)})")
    demo.add_argument("--small", action="store_true", help=_SMALL)
    demo.add_argument("--repeat", type=int_at_least(1), default=5,
                      help="timed repeats (median reported)")
    demo.set_defaults(cmd="demo")
    sub.add_parser("models", aliases=["zoo"], help="list the models loadable by name"
                   ).set_defaults(cmd="models")
    graph = sub.add_parser("graph", help="print a model's op graph and FuseOps' groups")
    graph.add_argument("model", type=model_spec, help=_MODEL)
    graph.add_argument("--small", action="store_true", help=_SMALL)
    graph.set_defaults(cmd="graph")
    explain = sub.add_parser("explain", help="CostFuse's plan for a model, with reasons and costs")
    explain.add_argument("model", type=model_spec, help=_MODEL)
    explain.add_argument("--target", default="host", choices=preset_names(),
                         help="target description to plan for (default: host, this CPU)")
    explain.add_argument("--small", action="store_true", help=_SMALL)
    explain.add_argument("--json", action="store_true", help="print the report as JSON")
    explain.add_argument("--plot", metavar="PNG", type=plot_file,
                         help="draw the fused graph to this file")
    explain.add_argument("--no-fold", action="store_true",
                         help="plan the model as written: no batch norm or convolution branch "
                              "folded into the weights first")
    _caps(explain)
    explain.set_defaults(cmd="explain")
    comp = sub.add_parser("compile", help="compile a model into a library plain TVM loads "
                          "(tvm.runtime.load_module + relax.VirtualMachine)")
    comp.add_argument("model", type=one_model,
                      help=f"{_MODEL}, or package.module:function returning (mod, inputs)")
    comp.add_argument("-o", "--output", required=True, type=output_file,
                      help="the shared library to write (.so)")
    comp.add_argument("--target", default="host", type=target_spec,
                      help="host (this CPU), a GPU preset (h100...), or a tvm target string "
                           "('llvm -mcpu=znver3', 'cuda -arch=sm_90')")
    comp.add_argument("--strategy", default="costfuse",
                      help="costfuse, tvm (FuseOps), none, or a variant (costfuse-xgb..., "
                           "costfuse-unfolded: no weight folding)")
    comp.add_argument("--config", nargs="+", metavar="KEY=VALUE", default=None,
                      help="CostFuse options (costfuse.* PassContext keys, prefix optional)")
    comp.add_argument("--report", default=None, type=output_file,
                      help="also write the plan (groups, decisions, predicted times) as JSON")
    comp.add_argument("--verify", action="store_true",
                      help="also build without fusion and report the largest relative error")
    comp.set_defaults(cmd="compile")
    from .cost.learned import MIN_RECORDS
    from .report.bench import DEFAULT_PEERS, OURS, PEERS
    from .strategies import STRATEGIES, VARIANTS
    from .tuning.labels import LABELS

    ours = tuple(s for s in STRATEGIES if s != "stock") + tuple(VARIANTS)
    bench = sub.add_parser("bench", help="time our strategies next to PyTorch eager and ONNX "
                           "Runtime at equal threads (interleaved rounds, numerics checked)")
    bench.add_argument("models", nargs="+", type=one_model,
                       help=f"{_MODEL}; eager needs a PyTorch form (a corpus name or a .pt2)")
    bench.add_argument("--threads", nargs="+", type=int_at_least(1), default=[1],
                       help="thread counts, each used by every column (default 1)")
    bench.add_argument("--peers", default=list(DEFAULT_PEERS), type=csv_choices(PEERS),
                       help=f"comma-separated, from {','.join(PEERS)} (default "
                            f"{','.join(DEFAULT_PEERS)}; compile = torch.compile, Inductor: "
                            "minutes of compiling per model and thread count)")
    bench.add_argument("--strategies", default=list(OURS), type=csv_choices(ours),
                       help=f"ours, comma-separated (default {','.join(OURS)})")
    bench.add_argument("--repeat", type=int_at_least(1), default=5,
                       help="interleaved timing rounds (median reported)")
    bench.add_argument("--small", action="store_true", help=_SMALL)
    bench.add_argument("--huge-pages", action="store_true",
                       help="before timing, move the process's resident buffers (every "
                            "column's weights and pooled buffers alike) to 2 MiB pages (Linux "
                            "6.1+; tvm_costfuse.huge_pages): decode steps stream their weights "
                            "faster")
    bench.add_argument("--out", default=None, type=output_file,
                       help="also write the markdown table here")
    bench.add_argument("--plot", metavar="PNG", type=plot_file,
                       help="also draw costfuse's speedup over each column, per model and "
                            "thread count, to this file (needs matplotlib: the plot extra)")
    bench.set_defaults(cmd="bench")
    reg = sub.add_parser("regret", help="CostFuse's plan against the best plan measured "
                         "around it (each region flipped to FuseOps' grouping, then the "
                         "faster flips together): end-to-end regret and in-model decisions")
    reg.add_argument("models", nargs="+", type=one_model, help=_MODEL)
    reg.add_argument("--threads", nargs="+", type=int_at_least(1), default=[1],
                     help="thread counts, each planned, built and timed apart (default 1)")
    reg.add_argument("--repeat", type=int_at_least(5), default=7,
                     help="interleaved timing rounds per round of the search (median)")
    reg.add_argument("--builds", type=int_at_least(1), default=1, metavar="N",
                     help="compilations of each whole plan timed in the second round, a plan's "
                          "time the median of theirs (a decode step's builds differ by ~5%%; "
                          "default 1)")
    reg.add_argument("--confirm", type=int_at_least(0), default=3, metavar="N",
                     help="where round 2's fastest plan is not CostFuse's, compile both N "
                          "times afresh and read the regret from their side-by-side timing "
                          "(the pick's edge may be its luck; 0: take round 2's; default 3)")
    reg.add_argument("--replicate", action=argparse.BooleanOptionalAction, default=True,
                     help="measure each region clear in round 1 again on fresh builds of both "
                          "sides; it stays clear only where it does so again (default on)")
    reg.add_argument("--small", action="store_true", help=_SMALL)
    reg.add_argument("--out", default=None, type=output_file,
                     help="also write the markdown tables here")
    reg.set_defaults(cmd="regret")
    cmp = sub.add_parser("compare", help="models x strategies x targets: kernels, bytes, "
                         "predicted/measured time, registers; CSV, markdown and plots")
    cmp.add_argument("--models", nargs="+", default=[["all"]], type=compare_models,
                     help="model names, 'all' (the zoo), 'corpus', .onnx/.pt2 paths, "
                          "module:function (torch); comma-separated or repeated")
    cmp.add_argument("--strategies", default=list(COMPARED), type=csv_choices(COMPARED),
                     help=f"comma-separated, from {','.join(COMPARED)}")
    cmp.add_argument("--targets", default=["llvm"], type=csv_choices(TARGETS),
                     help="llvm and/or cuda, comma-separated (cuda: compiled offline)")
    cmp.add_argument("--gpu", default="h200", choices=[n for n in preset_names() if n != "host"],
                     help="description the cuda target is compiled and priced for")
    cmp.add_argument("--out", default="compare_results", type=output_dir,
                     help="output folder")
    cmp.add_argument("--small", action="store_true", help="the zoo's small shapes")
    cmp.add_argument("--repeat", type=int_at_least(1), default=5,
                     help="interleaved timing rounds")
    cmp.add_argument("--measure-cuda", action=argparse.BooleanOptionalAction, default=None,
                     help="time CUDA builds (default: when a GPU is present)")
    cmp.add_argument("--no-progress", action="store_true", help="no progress bar")
    cmp.set_defaults(cmd="compare")
    tune = sub.add_parser("tune", help="measure labels for the cost models into tuning_logs/ "
                          "(by default candidate groups: then retrain the learned model and "
                          "re-plan; resumable: what is recorded is not measured again)")
    tune.add_argument("models", nargs="*", type=tune_model, metavar="model",
                      help=f"{_MODEL}, all (the zoo) or corpus; several allowed")
    tune.add_argument("--labels", choices=LABELS, default="groups",
                      help="groups: time each candidate group alone, then retrain and re-plan; "
                           "pairs: time each candidate decision's three kernels side by side; "
                           "in-model: time each final decision of the plan fused and split "
                           "inside the model (`costfuse evaluate` scores all three)")
    tune.add_argument("--budget", type=budget, default=None, metavar="N|all",
                      help="per model variant: candidate groups (default 32), or decisions "
                           "with pairs and in-model (default all); a number or all")
    tune.add_argument("--size", nargs="+", choices=("small", "full"), default=["full"],
                      help="the models' shapes, one or both (default full)")
    tune.add_argument("--small", dest="size", action="store_const", const=["small"],
                      help=f"{_SMALL}; the same as --size small")
    tune.add_argument("--synthetic", type=int_at_least(1), default=0, metavar="N",
                      help="also the random test programs synth-0 .. synth-<N-1>")
    tune.add_argument("--target", default="host", choices=preset_names(),
                      help="host CPU (timed here), or a GPU preset (groups only: CUDA kernels, "
                           "ptxas registers and spills always, times where a GPU is present)")
    tune.add_argument("--repeat", type=int_at_least(1), default=None, metavar="N",
                      help="timed samples per group (default 3); pairs: rounds per process "
                           "(default 7); in-model: interleaved runs of the model (default 5)")
    tune.add_argument("--processes", type=int_at_least(1), default=None, metavar="N",
                      help="pairs: time each decision in this many worker processes (a "
                           "process's code and buffer placement can slow a kernel steadily); "
                           "a kernel costs the mean of their medians (default 1)")
    tune.add_argument("--min-repeat-ms", type=int_at_least(0), default=30, metavar="MS",
                      help="groups, pairs: the least duration of one timed sample")
    tune.add_argument("--timeout", type=float_in(0, open_lo=True), default=120.0, metavar="S",
                      help="groups, pairs: seconds to build and run one kernel")
    tune.add_argument("--retrain-only", action="store_true",
                      help="measure nothing: retrain the learned model on the recorded groups "
                           "and save it, then re-plan the models given")
    tune.add_argument("--work-dir", default=None, type=output_dir, metavar="DIR",
                      help="default tuning_logs/<target>/groups (TVM_COSTFUSE_TUNING_DIR moves it)")
    tune.add_argument("--rpc-tracker", default=None, metavar="HOST:PORT:KEY",
                      type=rpc_tracker,
                      help="groups: run the kernels on an RPC server from this TVM tracker")
    tune.add_argument("--wait", action="store_true",
                      help="another session writing the folder: wait for it (default: refuse)")
    tune.set_defaults(cmd="tune")
    ev = sub.add_parser("evaluate", help="score the cost models on the measured labels, "
                        "leaving one family out: decision accuracy next to always / never fuse")
    ev.add_argument("--by", choices=("family", "architecture"), default="family",
                    help="hold out each family (models.family) or each architecture in turn")
    ev.add_argument("--seeds", type=int_at_least(1), default=5, metavar="N",
                    help="learned-model trainings per held-out unit (mean +- std)")
    ev.add_argument("--margin", type=float_in(0, 1), default=0.05, metavar="M",
                    help="the analytical model abstains below this predicted gain (default 0.05)")
    ev.add_argument("--min-records", type=int_at_least(1), default=MIN_RECORDS, metavar="N",
                    help="fewer training rows: the learned model answers analytically")
    ev.add_argument("--train-side-by-side", action="store_true",
                    help="train on the other units' side-by-side groups in place of their "
                         "separately timed rows")
    ev.add_argument("--train-synthetic", action="store_true",
                    help="train on the synthetic programs too (default: they are test data)")
    ev.add_argument("--work-dir", default=None, type=existing_dir, metavar="DIR",
                    help="default tuning_logs/<this host>/groups (TVM_COSTFUSE_TUNING_DIR "
                         "moves it)")
    ev.set_defaults(cmd="evaluate")
    for name, about, verb in (
            ("refeature", ("recompute the features of recorded groups (after the feature "
                           "schema grew), keeping their timings"), "recompute"),
            ("restamp", ("after an edit of the kernel code: keep the recorded groups whose "
                         "kernel it left unchanged (rebuilt and compared), so that `costfuse "
                         "tune` measures only the others again"), "check")):
        rows = sub.add_parser(name, help=about)
        rows.add_argument("--target", default="host", choices=preset_names(),
                          help=f"target whose recorded groups to {verb} (default: host)")
        rows.add_argument("--work-dir", default=None, type=output_dir,
                          help="default tuning_logs/<target>/groups (TVM_COSTFUSE_TUNING_DIR "
                               "moves it)")
        rows.set_defaults(cmd=name)
    cal = sub.add_parser("calibrate", help="measure this host's bandwidth, FLOP/s and launch cost")
    cal.add_argument("--quick", action="store_true", help="smaller buffers, fewer repeats")
    cal.add_argument("--cores", type=int_at_least(1), default=None,
                     help="threads (default: affinity)")
    cal.add_argument("--path", default=None, type=output_file,
                     help="JSON record (default in ~/.cache)")
    cal.set_defaults(cmd="calibrate")
    return parser


def check_tune(args: argparse.Namespace) -> None:
    """``tune``'s options that are wrong together, refused before anything is built."""
    label_only = {"--processes": args.processes is not None and args.labels != "pairs",
                  "--rpc-tracker": args.rpc_tracker and args.labels != "groups",
                  "--retrain-only": args.retrain_only and args.labels != "groups"}
    for option, wrong in label_only.items():
        if wrong:
            raise UsageError(f"{option} does not apply to --labels {args.labels}")
    if args.target != "host" and args.labels != "groups":
        raise UsageError(f"--labels {args.labels} times CPU kernels here: use --target host")
    if args.target != "host" and args.rpc_tracker:
        raise UsageError("--rpc-tracker times CPU kernels only; run a GPU target on the GPU "
                         "machine itself")
    if not (args.models or args.synthetic or args.retrain_only):
        raise UsageError("no model to measure: name one, all (the zoo), corpus, or give "
                         "--synthetic N")
