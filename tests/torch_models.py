"""Tiny PyTorch modules with the structure of real models that broke CostFuse (random weights)."""

from __future__ import annotations

import torch
from torch import nn


class ShiftedWindowAttention(nn.Module):
    """One Swin block's attention: roll, window partition, q/k/v picked from one tensor
    (``take`` after import: opaque), relative position bias gathered from a table, roll back."""

    def __init__(self, dim: int = 16, heads: int = 2, window: int = 4, shift: int = 2) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.heads, self.window, self.shift = heads, window, shift
        self.table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads))
        grid = torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
        coords = torch.stack(grid).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + window - 1
        self.register_buffer("index", (rel[..., 0] * (2 * window - 1) + rel[..., 1]).flatten())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        s, n = self.window, self.window * self.window
        y = torch.roll(self.norm(x), shifts=(-self.shift, -self.shift), dims=(1, 2))
        y = y.view(b, h // s, s, w // s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, n, c)
        qkv = self.qkv(y).reshape(y.size(0), n, 3, self.heads, c // self.heads)
        qkv = qkv.permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1)
        bias = self.table[self.index].view(n, n, -1).permute(2, 0, 1)
        y = ((attn + bias).softmax(-1) @ v).transpose(1, 2).reshape(-1, n, c)
        y = self.proj(y).view(b, h // s, w // s, s, s, c).permute(0, 1, 3, 2, 4, 5)
        y = torch.roll(y.reshape(b, h, w, c), shifts=(self.shift, self.shift), dims=(1, 2))
        return x + y


class TwoIndexGather(nn.Module):
    """``x[i, j]`` with two index tensors (as HF masks index ``cache_position``): LegalizeOps
    binds the index tuple's items as ``lv``, ``lv1``..., names the importer used already."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(x)
        i = torch.arange(x.shape[0])[:, None]
        j = torch.arange(x.shape[1])[None, :]
        return torch.relu(x[i, j]) + x[j, i] * 2.0


class PackedSegments(nn.Module):
    """HF's packed-sequence detection: a bool cumsum (int64 in PyTorch) over position
    differences, used as an embedding index."""

    def __init__(self, vocab: int = 16, dim: int = 8, segments: int = 4) -> None:
        super().__init__()
        self.tok, self.seg = nn.Embedding(vocab, dim), nn.Embedding(segments, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        diff = torch.cat([torch.ones_like(ids[:, :1]), ids[:, 1:] - ids[:, :-1]], dim=-1)
        segment = (diff != 1).cumsum(-1)
        return self.tok(ids) + self.seg(segment % self.seg.num_embeddings)
