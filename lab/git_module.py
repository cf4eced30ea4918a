"""A module of this repository as it stood at a commit, loaded beside the current one, for
one-process A/Bs of code that builds kernels (``plan_ab.py --old``)::

    python3 lab/plan_ab.py --models efficientnet_b0 --threads 1 --old \\
        "tvm_costfuse.schedules.chain.schedule=__import__('git_module').load('f1c4a93', \\
        'schedules/chain.py', 'tvm_costfuse.schedules').schedule"

The old source runs with ``package`` as its package, so its relative imports take the current
modules beside it: only the loaded file is old.
"""

from __future__ import annotations

import subprocess
import types
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]


def load(commit: str, path: str, package: str) -> types.ModuleType:
    """``path`` at ``commit`` as a fresh module of ``package``."""
    source = subprocess.check_output(["git", "show", f"{commit}:{path}"], cwd=_REPO, text=True)
    name = f"{package}._at_{commit[:8]}_{Path(path).stem}"
    module = types.ModuleType(name)
    module.__package__ = package
    module.__file__ = f"{commit[:8]}:{path}"
    exec(compile(source, module.__file__, "exec", dont_inherit=True), module.__dict__)  # noqa: S102 -- our own file
    return module
