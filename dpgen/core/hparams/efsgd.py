"""``efsgd:`` block (configs/method/efsgd.yaml): the GS-WGAN keys plus error feedback, noise injection and
the reconstruction encoder."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpgen.core.checks import CheckContext, bad, nested, spec
from dpgen.core.hparams.dpac import ClassifierHparams, check_classifier_reuse
from dpgen.core.hparams.gswgan import EnsembleHparams
from dpgen.errors import DpgenError


@dataclass
class EncoderHparams:
    width: int = spec(ge=1)
    steps: int = spec(ge=0)
    kl_weight: float = spec(ge=0.0)
    code: str = spec(choices=("private", "raw", "prior"))  # raw: the paper's leaky version, paper accounting only;
    # prior: a public code from G's prior (Eq. 14 as written), no encoder and no code release
    code_clip: float = spec(gt=0.0)
    match: str = spec(choices=("first", "nearest"))  # code=prior: each row's target, the first or the nearest same-class record


@dataclass
class EfsgdHparams(EnsembleHparams):
    error_feedback: bool = spec()
    C2: float = spec(gt=0.0)                    # error clip; >= clip (C1) under privacy.accounting=paper (DiceSGD)
    sanitize: str = spec(choices=("joint", "per_path"))  # joint: D and lambda_c*C through one sanitiser (one path)
    noise_injection: bool = spec()
    sigma_noise: float = spec(ge=0.0)
    recon: bool = spec()
    gamma_recon: float = spec(ge=0.0)
    lambda_c: float = spec(ge=0.0)
    encoder: EncoderHparams = nested(EncoderHparams)
    classifier: ClassifierHparams = nested(ClassifierHparams)

    @staticmethod
    def cross_check(node: Any, key: str, ctx: CheckContext) -> None:
        EnsembleHparams.cross_check(node, key, ctx)
        check_classifier_reuse(node, key, ctx)
        if float(node.C2) < float(node.clip) and ctx.cfg.privacy.accounting == "paper":
            raise bad(f"{key}.C2", node.C2, f"a number >= {key}.clip={node.clip} (DiceSGD's noise rule, privacy.accounting=paper, needs C2 >= C1)")
        recon = bool(node.recon) and float(node.gamma_recon) > 0
        if recon and node.encoder.code == "raw" and ctx.cfg.privacy.accounting == "sound":
            raise DpgenError(f"{key}.encoder.code=raw leaks the encoder input through G's Jacobian; "
                             f"use privacy.accounting=paper or {key}.encoder.code=private")
