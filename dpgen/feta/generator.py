"""The released DP-FETA / DPDM generator: the EMA denoiser plus its sampler settings."""
from __future__ import annotations

from typing import Any

import torch

from dpgen.core.compile import compile_enabled
from dpgen.core.generator import ReleasedGenerator
from dpgen.errors import DpgenError
from dpgen.nets.edm import EDMDenoiser, sample
from dpgen.nets.unet import UNet

SAMPLER_KEYS = ("name", "steps", "sigma_min", "sigma_max", "rho", "churn", "s_min", "s_max", "s_noise", "guidance")


class FetaGenerator(ReleasedGenerator):
    """Class-conditional EDM diffusion model; ``generate`` runs the configured sampler (images in [0, 1]).

    ``unet``: UNet keyword arguments (nf, ch_mult, num_res_blocks, attn_res, dropout);
    ``sampler``: keyword arguments of :func:`dpgen.nets.edm.sample` (name ddim|edm, steps, churn, ...);
    ``chunk``: images per sampler call, ``None`` = sized by the device (:meth:`chunk_size`).
    """

    #: images per sampler call when ``chunk`` is None. On a CPU the UNet's activations for 1000 images leave
    #: the cache and one network evaluation costs ~2x more per image than in pieces of 100 (measured for the
    #: quick nf-8 UNet, 1 thread: 4.3 vs 2.3 ms per image); a GPU wants the largest batch it is given.
    AUTO_CHUNK = {"cpu": 100}
    GPU_CHUNK = 4096

    def __init__(self, num_classes: int, shape: list[int], unet: dict[str, Any], sampler: dict[str, Any],
                 chunk: int | None = None) -> None:
        unknown = set(sampler) - set(SAMPLER_KEYS)
        if unknown:
            raise DpgenError(f"unknown sampler settings {sorted(unknown)}; allowed: {', '.join(SAMPLER_KEYS)}")
        if chunk is not None and (isinstance(chunk, bool) or int(chunk) != chunk or int(chunk) < 1):
            raise DpgenError(f"feta.sample_chunk must be a positive integer or null, got {chunk!r}")
        super().__init__(num_classes=int(num_classes), shape=[int(s) for s in shape], unet=dict(unet),
                         sampler=dict(sampler), chunk=None if chunk is None else int(chunk))
        c, h, w = self.sample_shape
        if h != w:
            raise DpgenError(f"the UNet needs square images, got {h}x{w}")
        self.net = EDMDenoiser(UNet(c, h, int(num_classes), **unet))

        self.chunk = self.init_kwargs["chunk"]

    def chunk_size(self, device: torch.device) -> int:
        """Images per sampler call: :attr:`chunk` if set, else 100 on a CPU and :attr:`GPU_CHUNK` elsewhere."""
        if self.chunk is not None:
            return int(self.chunk)
        return self.AUTO_CHUNK.get(torch.device(device).type, self.GPU_CHUNK)

    def generate(self, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Run the sampler on ``labels`` in pieces of :meth:`chunk_size` (the same generator stream, in order);
        under ``compile=true`` (:func:`dpgen.core.compile.compile_enabled`) through :meth:`sampler_net`."""
        step = self.chunk_size(labels.device)
        net = self.sampler_net() if compile_enabled() else self.net
        parts = [sample(net, labels[i:i + step], self.sample_shape, generator, null_label=self.num_classes,
                        **self.init_kwargs["sampler"]) for i in range(0, labels.shape[0], step)]
        x = torch.cat(parts) if parts else torch.empty(0, *self.sample_shape, device=labels.device)
        return ((x + 1) / 2).clamp(0, 1)

    def sampler_net(self) -> torch.nn.Module:
        """The denoiser compiled for sampling (``torch.compile``, static shapes: one graph per chunk size, i.e. at
        most two per call, and twice that with guidance's doubled batch), built once. Kept out of the module's
        attributes so the state dict (the released file) is the eager one's."""
        net = self.__dict__.get("_sampler_net")
        if net is None:
            net = self.__dict__["_sampler_net"] = torch.compile(self.net, dynamic=False)
        return net
