"""torchvision architectures for the real-model corpus, with random weights.

Each builder takes ``small`` and returns ``(torch module, example args)``. The full variant is
the architecture as torchvision defines it (batch 1, 224 px, 1000 classes; ViT-B/16 with 2 of
its 12 encoder layers, like the 2-layer transformer encoders of ``corpus_text``). The small
variant keeps every block and every op and shrinks widths, image size and classes, so that a
test builds it in seconds: through the constructor's own width arguments where torchvision has
them, and with :func:`narrow` (every channel count divided by the same factor) where its widths
are hard-coded (ResNet, ResNeXt, GoogLeNet, Inception v3).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

# Keeps the op schemas defined by import_torchvision alive (a Library unregisters when freed).
_SCHEMAS: list = []


def import_torchvision():
    """``import torchvision``, also where its C++ ops do not load.

    The PyPI wheel of torchvision 0.28.0 is built against CUDA torch; with the CPU torch its
    ``_C`` extension fails to load, and then ``torchvision._meta_registrations`` registers fake
    kernels for ``torchvision::nms`` / ``qnms``, ops that only ``_C`` defines, and the import
    raises. Defining the two schemas first lets the (pure Python) model code import; the
    models here never call those ops.
    """
    try:
        import torchvision
    except RuntimeError as err:
        if "torchvision::nms" not in str(err):
            raise
        for key in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[key]
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for op in ("nms", "qnms"):
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _SCHEMAS.append(lib)
        import torchvision
    return torchvision


def narrow(model: nn.Module, factor: int, keep: tuple[int, ...] = (3,)) -> nn.Module:
    """Divide every channel count of ``model`` by ``factor``, in place; returns ``model``.

    Convolutions, batch norms and linears are replaced by narrower fresh ones, so the graph
    keeps every op and only the widths change. Image channels and class counts (``keep``)
    stay as they are. A grouped convolution keeps its channels per group (``groups`` shrinks
    with the channels) when ``factor`` divides ``groups``, else keeps ``groups``.
    """

    def width(c: int) -> int:
        if c in keep:
            return c
        if c % factor:
            raise ValueError(f"narrow: {c} channels are not divisible by {factor}")
        return c // factor

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Conv2d):
                groups = child.groups
                if groups > 1 and groups % factor == 0:
                    groups //= factor
                new = nn.Conv2d(width(child.in_channels), width(child.out_channels),
                                child.kernel_size, child.stride, child.padding, child.dilation,
                                groups, child.bias is not None, child.padding_mode)
            elif isinstance(child, nn.BatchNorm2d):
                new = nn.BatchNorm2d(width(child.num_features), child.eps, child.momentum)
            elif isinstance(child, nn.Linear):
                new = nn.Linear(width(child.in_features), width(child.out_features),
                                child.bias is not None)
            else:
                continue
            setattr(parent, name, new)
    return model


def _image(small: bool, small_px: int = 32) -> tuple[torch.Tensor]:
    px = small_px if small else 224
    return (torch.randn(1, 3, px, px),)


def _classes(small: bool) -> int:
    return 10 if small else 1000


def _narrowed(make: Callable[..., nn.Module], factor: int, small_px: int = 32):
    """A builder for a model whose widths torchvision hard-codes."""

    def build(small: bool):
        model = make(num_classes=_classes(small))
        if small:
            narrow(model, factor, keep=(3, _classes(small)))
        return model, _image(small, small_px)

    return build


def _resnet50(**kw):
    return import_torchvision().models.resnet50(weights=None, **kw)


def _resnext50(**kw):
    return import_torchvision().models.resnext50_32x4d(weights=None, **kw)


# transform_input and no aux heads: as torchvision configures both with trained weights.
# init_weights=False keeps PyTorch's default init: torchvision's (truncated normal, std 0.1 at
# any fan-in) grows activations ~5x per conv, to 1e12 at Inception v3's output.


def _googlenet(**kw):
    return import_torchvision().models.googlenet(
        weights=None, aux_logits=False, transform_input=True, init_weights=False, **kw)


def _inception_v3(**kw):
    return import_torchvision().models.inception_v3(
        weights=None, aux_logits=False, transform_input=True, init_weights=False, **kw)


def _mobilenet_v2(small: bool):
    tv = import_torchvision()
    width = 0.25 if small else 1.0
    return tv.models.mobilenet_v2(weights=None, width_mult=width,
                                  num_classes=_classes(small)), _image(small)


def _mobilenet_v3_large(small: bool):
    mv3 = import_torchvision().models.mobilenetv3
    setting, last = mv3._mobilenet_v3_conf("mobilenet_v3_large", width_mult=0.25 if small else 1.0)
    return mv3.MobileNetV3(setting, last, num_classes=_classes(small)), _image(small)


def _efficientnet_b0(small: bool):
    eff = import_torchvision().models.efficientnet
    setting, last = eff._efficientnet_conf(
        "efficientnet_b0", width_mult=0.25 if small else 1.0, depth_mult=1.0)
    model = eff.EfficientNet(setting, 0.2, num_classes=_classes(small), last_channel=last)
    return model, _image(small)


def _efficientnet_v2_s(small: bool):
    eff = import_torchvision().models.efficientnet
    setting, last = eff._efficientnet_conf("efficientnet_v2_s")
    if small:  # V2's stage table has no width multiplier: scale its channels by 1/8.
        for cnf in setting:
            cnf.input_channels //= 8
            cnf.out_channels //= 8
        last //= 8
    model = eff.EfficientNet(setting, 0.2, num_classes=_classes(small), last_channel=last,
                             norm_layer=partial(nn.BatchNorm2d, eps=1e-03))
    return model, _image(small)


def _regnet_y_400mf(small: bool):
    rn = import_torchvision().models.regnet
    # w_0 and w_a scaled alike keep the block capacities, hence depths and stages, unchanged.
    scale = 1 / 6 if small else 1.0
    params = rn.BlockParams.from_init_params(depth=16, w_0=int(48 * scale), w_a=27.89 * scale,
                                             w_m=2.09, group_width=8, se_ratio=0.25)
    model = rn.RegNet(params, num_classes=_classes(small), stem_width=8 if small else 32,
                      norm_layer=partial(nn.BatchNorm2d, eps=1e-05, momentum=0.1))
    return model, _image(small)


def _densenet121(small: bool):
    dn = import_torchvision().models.densenet
    growth, init = (4, 8) if small else (32, 64)
    model = dn.DenseNet(growth, (6, 12, 24, 16), init, num_classes=_classes(small))
    return model, _image(small)


def _squeezenet1_1(small: bool):
    tv = import_torchvision()
    return tv.models.squeezenet1_1(weights=None, num_classes=_classes(small)), _image(small)


def _shufflenet_v2_x1_0(small: bool):
    sh = import_torchvision().models.shufflenetv2
    channels = [8, 16, 32, 64, 128] if small else [24, 116, 232, 464, 1024]
    return sh.ShuffleNetV2([4, 8, 4], channels, num_classes=_classes(small)), _image(small)


def _mnasnet1_0(small: bool):
    mn = import_torchvision().models.mnasnet
    return mn.MNASNet(0.25 if small else 1.0, num_classes=_classes(small)), _image(small)


def _vit_b_16(small: bool):
    vit = import_torchvision().models.vision_transformer
    if small:
        model = vit.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                      hidden_dim=32, mlp_dim=64, num_classes=10)
    else:
        model = vit.VisionTransformer(image_size=224, patch_size=16, num_layers=2, num_heads=12,
                                      hidden_dim=768, mlp_dim=3072)
    # torchvision zero-initialises the classifier (a constant 0 output checks nothing).
    nn.init.normal_(model.heads.head.weight, std=0.02)
    return model, _image(small)


def _swin_t(small: bool):
    sw = import_torchvision().models.swin_transformer
    # The small one keeps 4 stages with a shifted window in each stage but the last (where the
    # window covers the whole map, as in the full model at 224 px).
    embed, heads, window = (16, [1, 2, 4, 8], [2, 2]) if small else (96, [3, 6, 12, 24], [7, 7])
    model = sw.SwinTransformer([4, 4], embed, [2, 2, 6, 2], heads, window,
                               stochastic_depth_prob=0.2, num_classes=_classes(small))
    return model, _image(small, 64)


# name -> (family, builder(small) -> (module, args))
MODELS: dict[str, tuple[str, Callable]] = {
    "resnet50": ("cnn", _narrowed(_resnet50, 8)),
    "resnext50_32x4d": ("cnn", _narrowed(_resnext50, 8)),
    "mobilenet_v2": ("cnn", _mobilenet_v2),
    "mobilenet_v3_large": ("cnn", _mobilenet_v3_large),
    "efficientnet_b0": ("cnn", _efficientnet_b0),
    "efficientnet_v2_s": ("cnn", _efficientnet_v2_s),
    "regnet_y_400mf": ("cnn", _regnet_y_400mf),
    "densenet121": ("cnn", _densenet121),
    "squeezenet1_1": ("cnn", _squeezenet1_1),
    "shufflenet_v2_x1_0": ("cnn", _shufflenet_v2_x1_0),
    "mnasnet1_0": ("cnn", _mnasnet1_0),
    "googlenet": ("cnn", _narrowed(_googlenet, 8)),
    "inception_v3": ("cnn", _narrowed(_inception_v3, 8, small_px=75)),
    "vit_b_16": ("vision_transformer", _vit_b_16),
    "swin_t": ("vision_transformer", _swin_t),
}
