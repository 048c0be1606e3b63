"""A small DDPM++-style conditional UNet (Song et al. 2021 NCSN++/DDPM++, as configured by DPDM and DP-FETA).

Levels of residual blocks (GroupNorm, SiLU, 3×3 convs, noise/label embedding added in the middle),
self-attention at the listed resolutions and in the middle block, skip connections scaled by 1/√2,
and a label embedding with one extra "null" entry for classifier-free guidance (DPDM, Sec. 4).
Only Conv2d / Linear / GroupNorm / Embedding carry parameters, all of which opacus' GradSampleModule
supports, so per-sample gradients come from opacus hooks.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from dpgen.errors import DpgenError


def _groups(ch: int) -> int:
    """GroupNorm groups: up to 32 groups of at least 4 channels (DDPM++ uses min(32, ch//4))."""
    g = min(32, max(1, ch // 4))
    while ch % g:
        g -= 1
    return g


class PositionalEmbedding(nn.Module):
    """Sinusoidal embedding of the scalar noise input c_noise (Vaswani et al. 2017; DDPM++ 'positional')."""

    def __init__(self, dim: int, max_positions: int = 10000) -> None:
        super().__init__()
        self.dim, self.max_positions = dim, max_positions

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        freqs = torch.exp(-math.log(self.max_positions) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        arg = t.float()[:, None] * freqs[None]
        return torch.cat([arg.cos(), arg.sin()], dim=1)


class ResBlock(nn.Module):
    """GroupNorm → SiLU → conv, + embedding, GroupNorm → SiLU → dropout → conv, skip / √2 (DDPM++)."""

    def __init__(self, cin: int, cout: int, emb_dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(_groups(cin), cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.emb = nn.Linear(emb_dim, cout)
        self.norm2, self.conv2 = nn.GroupNorm(_groups(cout), cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.drop = nn.Dropout(dropout)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.emb(emb)[:, :, None, None]
        h = self.conv2(self.drop(F.silu(self.norm2(h))))
        return (h + (x if self.skip is None else self.skip(x))) / math.sqrt(2.0)


class Attention(nn.Module):
    """Single-head spatial self-attention with 1×1 conv projections (DDPM++ AttnBlock)."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(_groups(ch), ch)
        self.qkv = nn.Conv2d(ch, 3 * ch, 1)
        self.proj = nn.Conv2d(ch, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, h * w).unbind(1)
        att = torch.softmax(torch.einsum("bci,bcj->bij", q, k) / math.sqrt(c), dim=-1)
        out = torch.einsum("bij,bcj->bci", att, v).reshape(b, c, h, w)
        return (x + self.proj(out)) / math.sqrt(2.0)


class UNet(nn.Module):
    """Conditional UNet F(x, c_noise, label); ``label == num_classes`` is the null (unconditional) class."""

    def __init__(self, in_ch: int, resolution: int, num_classes: int, nf: int = 32,
                 ch_mult: Sequence[int] = (2, 2), num_res_blocks: int = 2, attn_res: Sequence[int] = (14,),
                 dropout: float = 0.0) -> None:
        super().__init__()
        if nf < 4 or nf % 4 or not ch_mult or num_res_blocks < 1:
            raise DpgenError(f"UNet needs nf a multiple of 4, a non-empty ch_mult and >=1 res block; got nf={nf}, "
                             f"ch_mult={list(ch_mult)}, num_res_blocks={num_res_blocks}")
        attn_res = {int(r) for r in attn_res}
        emb = 4 * nf
        self.num_classes = num_classes
        self.t_embed = PositionalEmbedding(nf)
        self.t_mlp = nn.Sequential(nn.Linear(nf, emb), nn.SiLU(), nn.Linear(emb, emb))
        self.label_embed = nn.Embedding(num_classes + 1, emb)  # +1: null class for classifier-free guidance
        self.conv_in = nn.Conv2d(in_ch, nf, 3, padding=1)

        self.down = nn.ModuleList()
        chans, ch, res = [nf], nf, resolution
        for level, mult in enumerate(ch_mult):
            for _ in range(num_res_blocks):
                block = nn.ModuleList([ResBlock(ch, nf * mult, emb, dropout)])
                ch = nf * mult
                if res in attn_res:
                    block.append(Attention(ch))
                self.down.append(block)
                chans.append(ch)
            if level < len(ch_mult) - 1:
                self.down.append(nn.ModuleList([nn.Conv2d(ch, ch, 3, stride=2, padding=1)]))
                chans.append(ch)
                res = (res + 1) // 2
        self.mid = nn.ModuleList([ResBlock(ch, ch, emb, dropout), Attention(ch), ResBlock(ch, ch, emb, dropout)])

        self.up = nn.ModuleList()
        for level, mult in reversed(list(enumerate(ch_mult))):
            for _ in range(num_res_blocks + 1):
                block = nn.ModuleList([ResBlock(ch + chans.pop(), nf * mult, emb, dropout)])
                ch = nf * mult
                if res in attn_res:
                    block.append(Attention(ch))
                self.up.append(block)
            if level > 0:
                self.up.append(nn.ModuleList([nn.Conv2d(ch, ch, 3, padding=1)]))  # after nearest upsampling
                res = res * 2
        self.norm_out = nn.GroupNorm(_groups(ch), ch)
        self.conv_out = nn.Conv2d(ch, in_ch, 3, padding=1)

    @staticmethod
    def _run(block: nn.ModuleList, h: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        for layer in block:
            h = layer(h, emb) if isinstance(layer, ResBlock) else layer(h)
        return h

    def forward(self, x: torch.Tensor, c_noise: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        emb = F.silu(self.t_mlp(self.t_embed(c_noise)) + self.label_embed(labels))
        h = self.conv_in(x)
        skips = [h]
        for block in self.down:
            h = self._run(block, h, emb)
            skips.append(h)
        for layer in self.mid:
            h = layer(h, emb) if isinstance(layer, ResBlock) else layer(h)
        for block in self.up:
            if isinstance(block[0], ResBlock):
                h = self._run(block, torch.cat([h, skips.pop()], dim=1), emb)
            else:  # upsample to the size of the next skip (7 -> 14 -> 28 also for odd sizes)
                h = block[0](F.interpolate(h, size=skips[-1].shape[-2:], mode="nearest"))
        return self.conv_out(F.silu(self.norm_out(h)))
