"""The package's shape: no import cycles (function-level imports included), small modules,
``schedules/`` below everything but the target facts it schedules for."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "tvm_costfuse"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, with ``schedules/`` installed as ``tvm_costfuse.schedules``."""
    out = {}
    for base, prefix in ((ROOT / PACKAGE, PACKAGE), (ROOT / "schedules", f"{PACKAGE}.schedules")):
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([prefix, *parts])] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Package modules ``name`` imports anywhere in its file (module or function level)."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            bases = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = here[: len(here) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # ``from pkg import sub`` imports the submodule; ``from pkg import name``, the package
            bases = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                     for a in node.names]
        else:
            continue
        for b in bases:
            # the longest known module the name lies in (a submodule, else its package)
            while b and b not in known:
                b = b.rpartition(".")[0]
            if b and b != name and b != PACKAGE:
                found.add(b)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycles_among_the_package_modules() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_over_the_line_budget() -> None:
    long = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) >
            MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_schedules_import_nothing_above_them() -> None:
    """Schedule rules depend on TVM and the target facts they schedule for, nothing else."""
    allowed = (f"{PACKAGE}.schedules", f"{PACKAGE}.targets.isa", f"{PACKAGE}.targets")
    graph = _graph()
    bad = {m: sorted(d for d in deps if not d.startswith(allowed))
           for m, deps in graph.items() if m.startswith(f"{PACKAGE}.schedules")}
    assert not any(bad.values()), bad


def _reaches(graph: dict[str, set[str]], start: str, prefix: str) -> list[str]:
    """Modules under ``start`` importing a module under ``prefix``, with what they import."""
    return sorted(f"{m} -> {d}" for m, deps in graph.items() if m.startswith(start)
                  for d in deps if d.startswith(prefix))


def test_cost_models_read_records_without_climbing_into_tuning() -> None:
    """The cost models read the measured rows (``records/``); the feedback loop that writes
    them (``tuning/``) sits above the cost models and imports them, not the other way."""
    graph = _graph()
    assert not _reaches(graph, f"{PACKAGE}.cost", f"{PACKAGE}.tuning")
    # nor does it name workloads: ``records.rows`` says what a row's workload was
    assert not _reaches(graph, f"{PACKAGE}.cost", f"{PACKAGE}.models")
    assert not _reaches(graph, f"{PACKAGE}.records", f"{PACKAGE}.cost")
    assert not _reaches(graph, f"{PACKAGE}.records", f"{PACKAGE}.tuning")


def _script_reaches() -> dict[str, list[str]]:
    """Per script in ``scripts/``: its ``sys.path`` edits and the private names it imports
    (a ``_name``, or a module under a ``_module``) from the package."""
    found = {}
    for path in sorted((ROOT / "scripts").glob("*.py")):
        tree = ast.parse(path.read_text())
        bad = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(
                    node.value, ast.Name) and node.value.id == "sys":
                bad.append("sys.path")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
                names = [a.name for a in node.names]
                parts = node.module.split(".")
                bad += [f"{node.module}.{n}" for n in names if n.startswith("_")]
                bad += [node.module for p in parts if p.startswith("_")][:1]
        if bad:
            found[path.name] = bad
    return found


def test_scripts_use_the_package_through_its_public_names() -> None:
    """Scripts are thin: they call the package as a user would, never its private names or
    a patched import path (research that needs more lives in ``lab/``, outside the product)."""
    assert not _script_reaches()


def test_every_package_folder_is_installed():
    """pyproject lists the packages by name: a folder missing there imports from a checkout
    (editable install) and is absent from a wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    folders = {".".join((PACKAGE, *p.parent.relative_to(ROOT / PACKAGE).parts))
               for p in (ROOT / PACKAGE).rglob("__init__.py")}
    assert folders <= listed, sorted(folders - listed)


def test_each_target_kind_has_one_record_per_layer_and_others_are_refused_by_name():
    import pytest
    import tvm

    from tvm_costfuse.cost.analytical import kind_model
    from tvm_costfuse.pipelines import build_pipeline
    from tvm_costfuse.schedules import backend
    from tvm_costfuse.targets import resolve
    from tvm_costfuse.tuning.runners import runner_kind

    for spec, column in (("llvm", "cpu"), ("h100", "cuda")):
        t = resolve(spec)
        assert kind_model(t.desc).card_column == column
        assert backend(t.tvm).needs_schedule == (column == "cuda")
        assert runner_kind(t.tvm).local is not None
    other = tvm.target.Target("c")
    for refuse in (backend, runner_kind, build_pipeline):
        with pytest.raises(ValueError, match="not 'c'"):
            refuse(other)
