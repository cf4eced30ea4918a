"""Models: every workload CostFuse compiles, resolved by name through one registry.

- ``zoo``       -- eleven hand-written ``relax.frontend.nn`` workloads (the unit-test substrate);
- ``synthetic`` -- random programs over the zoo's op vocabulary, named ``synth-<seed>``;
- ``blocks``    -- the building blocks both share; ``export``: nn module -> bound IRModule;
- ``frontends`` -- PyTorch (``torch.export``) and ONNX importers (optional extras);
- ``corpus``    -- real torchvision and Hugging Face architectures with random weights
                   (the ``corpus`` extra: torch, torchvision, transformers), by name and family.

:func:`load` takes a zoo or corpus name, ``synth-<seed>``, an ``.onnx`` file, a ``torch.export`` archive
(``.pt2``) or ``package.module:function`` returning ``(torch.nn.Module, example_args)``.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import numpy as np
import tvm

from . import synthetic, zoo
from .frontends import load_exported, load_onnx, load_torch

__all__ = [
    "corpus_names",
    "display_name",
    "family",
    "is_name",
    "load",
    "load_exported",
    "load_onnx",
    "load_torch",
    "load_variant",
    "names",
    "variant_name",
]


def corpus_names() -> list[str]:
    """The corpus' model names; none when its packages (the ``corpus`` extra) are missing."""
    try:
        from . import corpus

        return corpus.names()  # imports torch, torchvision and transformers
    except ImportError:
        return []


def names() -> list[str]:
    """Every model name :func:`load` accepts without a path, in a stable order: the zoo,
    then the corpus (when its extra is installed)."""
    return zoo.names() + corpus_names()


def is_name(spec: str) -> bool:
    """Whether ``spec`` names a registry model (a zoo or corpus name, or ``synth-<seed>``);
    the corpus is consulted (importing torch) only for names the zoo does not have."""
    return spec in zoo.names() or synthetic.is_synthetic(spec) or spec in corpus_names()


def _is_file(spec: str) -> bool:
    return spec.endswith((".onnx", ".pt2")) or os.path.isfile(spec)


def display_name(spec: str) -> str:
    """How reports name a model: its registry name, a file's stem, or the function's name."""
    if is_name(spec):
        return spec
    if _is_file(spec):
        return Path(spec).stem
    return spec.split(":", 1)[-1]


def load(spec: str, *, small: bool = False) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """(IRModule with only ``main``, weights bound as constants; {input name: array}).

    ``small`` picks a registry model's test variant; it does not apply to files or to
    synthetic programs, which draw their own sizes.
    """
    if spec in zoo.names():
        return zoo.load(spec, small=small)
    if synthetic.is_synthetic(spec):
        if small:
            raise ValueError(f"{spec}: synthetic programs draw their own sizes; small=True "
                             "does not apply")
        return synthetic.load(spec)
    if spec in corpus_names():
        from . import corpus

        mod, inputs, _ = corpus.load(spec, small=small)
        return mod, inputs
    if _is_file(spec):
        if not os.path.isfile(spec):
            raise ValueError(f"model file {spec!r} does not exist")
        return load_exported(spec) if spec.endswith(".pt2") else load_onnx(spec)
    if ":" in spec:
        module_name, func_name = spec.split(":", 1)
        module, args = getattr(importlib.import_module(module_name), func_name)()
        return load_torch(module, tuple(args))
    raise ValueError(
        f"unknown model {spec!r}: a name ({', '.join(names())}), {synthetic.PREFIX}<seed>, "
        "an .onnx or .pt2 path, or package.module:function"
    )


def variant_name(name: str, small: bool) -> str:
    """How measurement records name a model variant: ``bert_layer``, ``bert_layer@small``."""
    return f"{name}@small" if small else name


def family(model: str) -> str:
    """The architecture family of a registry model or a stored variant name (``bert@small``):
    the corpus' families, ``zoo.FAMILIES`` for the zoo, ``synthetic`` for ``synth-<seed>``."""
    name = model.removesuffix("@small")
    if synthetic.is_synthetic(name):
        return "synthetic"
    if name in zoo.FAMILIES:
        return zoo.FAMILIES[name]
    from . import corpus  # the corpus extra; a name outside every registry raises here

    return corpus.family(name)


def load_variant(model: str) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """:func:`load` for a name written by :func:`variant_name` (as stored in the databases)."""
    small = model.endswith("@small")  # a path may hold an "@" of its own
    return load(model.removesuffix("@small"), small=small)
