"""Schemas of the methods' hyperparameter blocks, one module per block (see :mod:`dpgen.core.schema`).

They live here rather than in the method packages because importing ``dpgen.<method>`` imports its
training code (torch, opacus: seconds), and every CLI start needs all the schemas. A new key is declared
in its block's class here (type, allowed values) and given its value in ``configs/method/<m>.yaml``.
"""
from dpgen.core.hparams.dpac import DpacHparams
from dpgen.core.hparams.dpaf import DpafHparams
from dpgen.core.hparams.dpgan import DpganHparams
from dpgen.core.hparams.efsgd import EfsgdHparams
from dpgen.core.hparams.feta import FetaHparams
from dpgen.core.hparams.gpate import GpateHparams
from dpgen.core.hparams.gswgan import GswganHparams

__all__ = ["DpacHparams", "DpafHparams", "DpganHparams", "EfsgdHparams", "FetaHparams", "GpateHparams",
           "GswganHparams"]
