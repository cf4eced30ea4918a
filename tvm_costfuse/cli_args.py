"""The ``costfuse`` command's arguments: its parser (:func:`build_parser`, one help line on
every argument: ``costfuse <command> --help`` is the reference) and every check of what the
user typed, each an argparse ``type=`` so that a bad value is refused with one line before any
work starts. The commands themselves are in ``cli``."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import tempfile
from collections.abc import Callable
from pathlib import Path

from . import models
from .config import INT_RANGES, FusionConfig
from .report.compare import COMPARED, TARGETS
from .targets import preset_names

__all__ = ["DEMO_MODELS", "DEMO_NOTES", "DESCRIPTION", "UsageError", "build_parser",
           "compare_models", "config_int", "csv_choices", "int_at_least", "model_spec", "one_model", "output_dir",
           "output_file", "plot_file", "rpc_tracker", "target_spec", "version"]

DESCRIPTION = ("costfuse: cost-model-driven operator fusion for Apache TVM (Relax). Compare "
               "its fusion plans with TVM's FuseOps, explain them, and tune its learned cost "
               "model on this machine.")


class UsageError(Exception):
    """A user error a command finds only while it runs (a model file that does not load, a
    tuning folder another session holds): printed as one line, exit status 2."""


def model_spec(text: str) -> str:
    """argparse type of a model argument: a registry name or an existing model file."""
    if models.is_name(text):
        return text
    if text.endswith((".onnx", ".pt2")):
        if not Path(text).is_file():
            raise argparse.ArgumentTypeError(f"model file {text!r} does not exist")
        return text
    raise argparse.ArgumentTypeError(
        f"unknown model {text!r}; choose a name from `costfuse models` or an .onnx/.pt2 path")


def compare_models(text: str) -> list[str]:
    """Comma-separated model specs of ``compare``: ``all`` (the zoo), ``corpus``, what
    :func:`model_spec` takes,
    or ``package.module:function`` whose module can be found."""
    specs = [x for x in text.split(",") if x]
    for spec in specs:
        if spec in ("all", "corpus") or spec.endswith((".onnx", ".pt2")) or ":" not in spec:
            if spec not in ("all", "corpus"):
                model_spec(spec)
            continue
        module = spec.split(":", 1)[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise argparse.ArgumentTypeError(f"{spec!r}: no Python module {module!r}")
    if not specs:
        raise argparse.ArgumentTypeError("no model given")
    return specs


def one_model(text: str) -> str:
    """argparse type of ``compile``'s model: what :func:`model_spec` takes, or
    ``package.module:function`` whose module can be found."""
    if text in ("all", "corpus") or "," in text:
        raise argparse.ArgumentTypeError(f"{text!r}: give one model")
    return compare_models(text)[0]


def target_spec(text: str) -> str:
    """argparse type of a target string: a preset name or a tvm target (``llvm -mcpu=...``,
    ``cuda -arch=sm_90``), checked by the resolver the pass itself uses."""
    from .targets import resolve

    try:
        resolve(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def csv_choices(choices) -> Callable[[str], object]:
    """argparse type of a comma-separated list whose items must be in ``choices``; an empty
    list or an unknown item is refused naming the valid choices."""
    valid = ", ".join(choices)

    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(
                f"empty list; give one or more of {valid} (comma-separated)")
        bad = [x for x in items if x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(repr, bad))}; choose from {valid} (comma-separated)")
        return items

    return parse


def int_at_least(lo: int) -> Callable[[str], object]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo}, got {value}")
        return value

    return parse


def config_int(field: str) -> Callable[[str], object]:
    """argparse type of a ``FusionConfig`` int: the range the config itself enforces."""
    lo, hi = INT_RANGES[field]

    def parse(text: str) -> int:
        value = int_at_least(lo)(text)
        if value > hi:
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}], got {value}")
        return value

    return parse


def _writable_in(folder: Path) -> None:
    """Raise ArgumentTypeError unless a file can be created in ``folder`` (tried, not
    guessed from permission bits: root passes ``os.access`` on read-only mounts)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".costfuse-probe-"):
            pass
    except OSError as err:
        raise argparse.ArgumentTypeError(
            f"cannot write in {folder}: {err.strerror or err}") from None


def output_dir(text: str) -> str:
    """argparse type of an output folder: an existing writable folder, or one that can be
    created under its nearest existing parent."""
    path = Path(text).expanduser().absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{existing} is not a folder")
    _writable_in(existing)
    return text


def output_file(text: str) -> str:
    """argparse type of an output file: its folder exists and is writable, and it is not a
    folder itself."""
    path = Path(text).expanduser().absolute()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"folder {path.parent} does not exist")
    _writable_in(path.parent)
    return text


def plot_file(text: str) -> str:
    """argparse type of a plot file: writable, with an image format matplotlib writes."""
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError("needs matplotlib (pip install 'tvm_costfuse[plot]')")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if Path(text).suffix.lstrip(".").lower() not in formats:
        raise argparse.ArgumentTypeError(
            f"{text}: not an image format matplotlib writes ({', '.join(sorted(formats))})")
    return output_file(text)


def rpc_tracker(text: str) -> str:
    """argparse type of ``--rpc-tracker``: HOST:PORT:KEY of a tracker that answers and has a
    server under KEY (checked now: otherwise every candidate would fail alike)."""
    from .tuning.runners import check_rpc_tracker  # tvm.rpc loads only when asked

    try:
        return check_rpc_tracker(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


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
    """The ``FusionConfig`` caps as options, with the ranges the config itself enforces."""
    defaults = FusionConfig()
    for field, what in (("max_chain_length", "longest producer->consumer chain in one group"),
                        ("max_body_ops", "most ops in one group"),
                        ("register_budget", "CUDA registers per thread a fused kernel may use")):
        lo, hi = INT_RANGES[field]
        parser.add_argument(f"--{field.replace('_', '-')}", type=config_int(field),
                            help=f"{what}: costfuse.{field}, {lo}-{hi} "
                                 f"(default {getattr(defaults, field)})")


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
                      help="costfuse, tvm (FuseOps), none, or a variant (costfuse-xgb...)")
    comp.add_argument("--config", nargs="+", metavar="KEY=VALUE", default=None,
                      help="CostFuse options (costfuse.* PassContext keys, prefix optional)")
    comp.add_argument("--report", default=None, type=output_file,
                      help="also write the plan (groups, decisions, predicted times) as JSON")
    comp.add_argument("--verify", action="store_true",
                      help="also build without fusion and report the largest relative error")
    comp.set_defaults(cmd="compile")
    from .report.bench import DEFAULT_PEERS, OURS, PEERS
    from .strategies import _VARIANTS, STRATEGIES

    ours = tuple(s for s in STRATEGIES if s != "stock") + tuple(_VARIANTS)
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
    bench.add_argument("--out", default=None, type=output_file,
                       help="also write the markdown table here")
    bench.add_argument("--plot", metavar="PNG", type=plot_file,
                       help="also draw costfuse's speedup over each column, per model and "
                            "thread count, to this file (needs matplotlib: the plot extra)")
    bench.set_defaults(cmd="bench")
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
    tune = sub.add_parser("tune", help="measure candidate groups into tuning_logs/, retrain the "
                          "learned model, re-plan (resumable: recorded groups are not re-measured)")
    tune.add_argument("model", type=model_spec, help=_MODEL)
    tune.add_argument("--budget", type=int_at_least(1), default=32,
                      help="candidate groups to measure")
    tune.add_argument("--small", action="store_true", help=_SMALL)
    tune.add_argument("--target", default="host", choices=preset_names(),
                      help="host CPU (timed here), or a GPU preset (CUDA kernels: ptxas "
                           "registers and spills always, times where a GPU is present)")
    tune.add_argument("--repeat", type=int_at_least(1), default=3,
                      help="timed samples per candidate group (default %(default)s)")
    tune.add_argument("--work-dir", default=None, type=output_dir,
                      help="default tuning_logs/<target>/groups (TVM_COSTFUSE_TUNING_DIR moves it)")
    tune.add_argument("--rpc-tracker", default=None, metavar="HOST:PORT:KEY",
                      type=rpc_tracker,
                      help="run the kernels on an RPC server from this TVM tracker")
    tune.add_argument("--wait", action="store_true",
                      help="another session writing the folder: wait for it (default: refuse)")
    tune.set_defaults(cmd="tune")
    ref = sub.add_parser("refeature", help="recompute the features of recorded groups (after "
                         "the feature schema grew), keeping their timings")
    ref.add_argument("--target", default="host", choices=preset_names(),
                     help="target whose recorded groups to recompute (default: host)")
    ref.add_argument("--work-dir", default=None, type=output_dir,
                     help="default tuning_logs/<target>/groups (TVM_COSTFUSE_TUNING_DIR moves it)")
    ref.set_defaults(cmd="refeature")
    cal = sub.add_parser("calibrate", help="measure this host's bandwidth, FLOP/s and launch cost")
    cal.add_argument("--quick", action="store_true", help="smaller buffers, fewer repeats")
    cal.add_argument("--cores", type=int_at_least(1), default=None,
                     help="threads (default: affinity)")
    cal.add_argument("--path", default=None, type=output_file,
                     help="JSON record (default in ~/.cache)")
    cal.set_defaults(cmd="calibrate")
    return parser
