"""Evaluation of labelled synthetic samples: downstream accuracy (g2r, r2g, real baseline), a CNN-feature
Frechet distance, and pytorch-fid Inception FID / IS when the weights file is available locally.

Public entry point: :func:`evaluate`.  Settings: ``configs/eval/default.yaml`` (quick, CPU) and
``configs/eval/paper.yaml`` (the DPDM / DPImageBench protocol).
"""
from dpgen.eval.api import evaluate
from dpgen.eval.config import EvalConfig, resolve_config

__all__ = ["evaluate", "EvalConfig", "resolve_config"]
