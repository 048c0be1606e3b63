"""``feta:`` block (configs/method/feta.yaml and dpdm.yaml): DP-FETA's central images and warm-up, and the
DPDM DP-SGD diffusion model both share."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dpgen.core.checks import CheckContext, bad, check_batch_le_n, int_list, nested, spec


@dataclass
class UnetHparams:
    nf: int = spec(ge=4)                        # a multiple of 4
    ch_mult: Any = spec()                       # a list of integers, or a comma-separated string "1,2,2"
    num_res_blocks: int = spec(ge=1)
    attn_res: Any = spec()                      # resolutions with attention, list or "8,16"
    dropout: float = spec(ge=0.0, lt=1.0)

    @staticmethod
    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        if int(node.nf) % 4:
            raise bad(f"{key}.nf", node.nf, "a multiple of 4 (GroupNorm groups)")
        for name, nonempty in (("ch_mult", True), ("attn_res", False)):
            values = int_list(node[name])
            if values is None or (nonempty and not values) or any(v < 1 for v in values):
                raise bad(f"{key}.{name}", node[name], "a list of positive integers or a string like '1,2,2'")


@dataclass
class SamplerHparams:
    name: str = spec(choices=("ddim", "edm"))
    steps: int = spec(ge=1)
    churn: float = spec(ge=0.0)
    s_min: float = spec(ge=0.0)
    s_max: float = spec(ge=0.0)
    s_noise: float = spec(gt=0.0)
    sigma_min: float = spec(gt=0.0)
    sigma_max: float = spec(gt=0.0)
    rho: float = spec(gt=0.0)
    guidance: float = spec(ge=0.0)

    @staticmethod
    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        if float(node.sigma_min) >= float(node.sigma_max):
            raise bad(f"{key}.sigma_min", node.sigma_min, f"a number < {key}.sigma_max={node.sigma_max}")


@dataclass
class FetaHparams:
    central: str = spec(choices=("mean", "mode", "none"))  # none: DPDM (no central images, no warm-up)
    num_central: int = spec(ge=0)
    central_batch: int = spec(ge=1)
    central_sigma: float = spec(gt=0.0)
    central_post: str = spec(choices=("official", "paper"))  # official: half-resolution query + filters (issue 16)
    central_clip: Optional[float] = spec(gt=0.0)
    bins: Optional[int] = spec(ge=2)
    warmup_iters: int = spec(ge=0)
    warmup_batch: int = spec(ge=1)
    warmup_lr: float = spec(gt=0.0)
    aug_ops: int = spec(ge=0, le=14)
    aug_magnitude: int = spec(ge=1, le=30)
    iters: int = spec(ge=0)
    batch_size: int = spec(ge=1)
    multiplicity: int = spec(ge=1)
    micro_batch: Optional[int] = spec(ge=1)   # records per micro-batch; None: sized from device memory
    clip: float = spec(gt=0.0)
    grad_backend: str = spec(choices=("ghost", "torch_func", "opacus"))  # per-record norms and clipped sum
    ghost_conv: str = spec(choices=("auto", "patches", "grouped"))  # ghost on a GPU: per-record conv gradients
    cuda_graph: bool = spec()  # CUDA: the DP-SGD micro-batch step captured once and replayed (dpgen/core/graph.py)
    noise_multiplier: Optional[float] = spec(gt=0.0)
    lr: float = spec(gt=0.0)
    ema: float = spec(ge=0.0, lt=1.0)
    label_dropout: float = spec(ge=0.0, lt=1.0)
    sample_chunk: Optional[int] = spec(ge=1)   # images per sampler call; None: sized by the device
    unet: UnetHparams = nested(UnetHparams)
    sampler: SamplerHparams = nested(SamplerHparams)

    @staticmethod
    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        if node.central != "none" and int(node.num_central) < 1:
            raise bad(f"{key}.num_central", node.num_central, f"an integer >= 1 when {key}.central={node.central}")
        check_batch_le_n(node, key, ctx, "batch_size", *(("central_batch",) if node.central != "none" else ()))
