"""The real-model corpus: torchvision and Hugging Face architectures, loadable by name.

``names()`` lists them, ``family(name)`` groups them (``cnn``, ``vision_transformer``,
``encoder``, ``decoder``, ``decode``, ``seq2seq``, ``speech``; ``decode``: a decoder's one-token step
against a KV cache) so that a cost model can be trained on some
families and judged on a held-out one, and ``load(name, small=False)`` returns
``(IRModule, inputs, torch module)``: the module imported through ``torch.export`` with its
weights bound as constants, the example inputs keyed by the Relax parameter names, and the
PyTorch module the outputs are compared against. ``load_onnx`` imports the same model through
an ONNX file instead, with the same input arrays.

Weights are random (nothing is downloaded) and the same name gives the same weights and inputs
on every call: the torch seed comes from the name. Batch norms get random running statistics
near identity, so that a fused kernel that drops or misapplies one changes the output.
``small=True`` is the same graph at tiny sizes, for tests (see ``corpus_vision`` and
``corpus_text`` for what each variant keeps).
"""

from __future__ import annotations

import inspect
import os
import tempfile
import zlib
from collections.abc import Callable

import numpy as np

__all__ = [
    "FAMILIES", "ONNX_EXPORTERS", "ONNX_NAMES", "build_torch", "family", "load", "load_onnx", "names",
    "torch_inputs",
]

FAMILIES = ("cnn", "vision_transformer", "encoder", "decoder", "decode", "seq2seq", "speech")

# Models that also go through torch.onnx.export and TVM's ONNX frontend (a spread over the
# families), with the exporter each needs: "torchscript" (opset 17) where it works, else
# "dynamo" (opset 18, needs onnxscript). The TorchScript exporter fails on torchvision's ViT
# (no ONNX symbolic for the fused `_native_multi_head_attention`), and on Hugging Face models
# it emits a ConstantOfShape of an empty shape (a scalar) for the attention mask, which TVM's
# ONNX frontend rejects (broadcast_to of a 1-d value to a 0-d shape).
ONNX_EXPORTERS = {
    "resnet50": "torchscript", "mobilenet_v2": "torchscript", "efficientnet_b0": "torchscript",
    "squeezenet1_1": "torchscript", "densenet121": "torchscript", "vit": "torchscript",
    "vit_b_16": "dynamo", "bert": "dynamo", "distilbert": "dynamo", "gpt2": "dynamo",
    "bart_encoder": "dynamo", "t5_encoder": "dynamo",
}
ONNX_NAMES = tuple(ONNX_EXPORTERS)


def _registry() -> dict[str, tuple[str, Callable]]:
    from . import corpus_text, corpus_vision

    return {**corpus_vision.MODELS, **corpus_text.MODELS}


def names() -> list[str]:
    """Every corpus model, vision first, in a stable order."""
    return list(_registry())


def family(name: str) -> str:
    """The architecture family of ``name``, one of :data:`FAMILIES`."""
    return _entry(name)[0]


def _entry(name: str) -> tuple[str, Callable]:
    registry = _registry()
    if name not in registry:
        raise ValueError(f"unknown corpus model {name!r}; valid names: {', '.join(registry)}")
    return registry[name]


def _seed(name: str) -> int:
    """crc32, not hash(): hash() is salted per process."""
    return zlib.crc32(name.encode())


def _randomize_batch_norms(module, gen) -> None:
    """Running statistics and affine terms near identity (fresh ones are exactly identity)."""
    import torch

    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.normal_(0.0, 0.05, generator=gen)
                m.running_var.uniform_(0.8, 1.2, generator=gen)
                m.weight.normal_(1.0, 0.1, generator=gen)
                m.bias.normal_(0.0, 0.05, generator=gen)


def build_torch(name: str, small: bool = False):
    """``(torch module in eval mode, example args)`` for ``name``, seeded from the name."""
    import torch

    from .corpus_vision import import_torchvision

    import_torchvision()  # transformers imports torchvision when it is installed
    torch.manual_seed(_seed(name))
    module, args = _entry(name)[1](small)
    _randomize_batch_norms(module, torch.Generator().manual_seed(_seed(name)))
    return module.eval(), tuple(args)


def _arg_names(module) -> list[str]:
    return list(inspect.signature(module.forward).parameters)


def load(name: str, small: bool = False):
    """``(IRModule with only main, {input name: array}, torch module)`` for ``name``.

    Imported with ``torch.export`` and ``from_exported_program`` (weights bound as constants,
    a unit output tuple unwrapped). Calling the torch module on :func:`torch_inputs` of the
    inputs gives the reference output.
    """
    from .frontends import load_torch

    module, args = build_torch(name, small)
    mod, inputs = load_torch(module, args)
    return mod, inputs, module


def torch_inputs(inputs: dict[str, np.ndarray]) -> tuple:
    """The inputs of :func:`load` as the positional torch tensors the torch module takes."""
    import torch

    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in inputs.values())


def load_onnx(name: str, small: bool = False, path: str | os.PathLike | None = None):
    """Like :func:`load`, through ``torch.onnx.export`` and TVM's ONNX frontend.

    The model is exported with the exporter :data:`ONNX_EXPORTERS` names for it (any other
    model: the TorchScript one) to ``path``, or to a temporary file removed afterwards; both
    exporters fold batch norms into the convolutions. The inputs are the same arrays
    :func:`load` returns, keyed by the ONNX module's parameter names.
    """
    import torch

    from .frontends import load_onnx as import_onnx

    module, args = build_torch(name, small)
    arg_names = _arg_names(module)
    with tempfile.TemporaryDirectory() as tmp:
        file = os.fspath(path) if path is not None else os.path.join(tmp, f"{name}.onnx")
        dynamo = ONNX_EXPORTERS.get(name) == "dynamo"
        with torch.no_grad():
            torch.onnx.export(module, args, file, input_names=arg_names, output_names=["out"],
                              opset_version=18 if dynamo else 17, dynamo=dynamo)
        mod, _ = import_onnx(file)
    arrays = dict(zip(arg_names, (a.numpy() for a in args), strict=True))
    params = [p.name for p in mod["main"].params]
    if params != arg_names:  # a renamed or dropped input would silently misalign the arrays
        raise ValueError(f"{name}: the ONNX module takes {params}, the model {arg_names}")
    return mod, arrays, module
