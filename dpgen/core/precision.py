"""Training precision: ``precision=fp32|tf32|bf16`` and ``cudnn_benchmark=true|false`` (configs/train.yaml).

:func:`training_precision` is entered by the pipeline around a method's ``train(hp, data, ledger, run)`` and
nowhere else: the released generator is sampled and evaluated in fp32 whatever the setting.

=========  =================================================================================================
``fp32``   changes nothing (torch's defaults; note that torch lets cuDNN convolutions use TF32 by default)
``tf32``   TF32 for fp32 matmuls and cuDNN convolutions (``allow_tf32`` flags, float32 matmul precision
           ``high``): tensors stay fp32, products keep a 10-bit mantissa on Ampere and later GPUs
``bf16``   ``tf32`` plus ``torch.autocast(device, bfloat16)``: the ops autocast lists (matmuls, convolutions,
           linear layers) run in bf16 in the forward and backward passes; parameters stay fp32
=========  =================================================================================================

The DP path stays fp32 under every setting, because a clipping bound or a noise std computed in bf16 (8-bit
mantissa) is off by up to 2^-8 relative, and the privacy analysis needs them exact: per-sample norms,
clipping factors and clipped sums, the Gaussian noise, the sanitizers' releases and the optimizer state
(:func:`full_precision` and :func:`at_least_fp32`, used by :mod:`dpgen.privacy` and the methods' mechanisms).
What is only *fed* to the clipping (a per-sample gradient computed by a bf16 forward/backward) may be
bf16: clipping bounds whatever vector it is given, so its precision is a matter of utility, not privacy.

The stacked ensembles (:mod:`dpgen.ensemble`: the GS-WGAN/DPAC/EFSGD discriminators, classifier, encoders
and warm-up generators) run their members under ``torch.func.vmap``, which autocast does not reach. Under
``bf16`` they cast their members' weights and inputs to bf16 explicitly inside the functional forward
(:func:`ensemble_compute` says in which dtype, and whether to compile and how to lay out convolutions); their
master weights, gradients and Adam moments stay fp32 (the casts' backward returns fp32 gradients).

Autocast runs with ``cache_enabled=False``: its cache of bf16 weight copies lives until the outermost
autocast region ends, and here that region spans every optimizer step, so a cached copy would be stale after
the first update.
"""
from __future__ import annotations

import logging
from contextlib import ExitStack, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, ContextManager, Iterator

import torch

from dpgen.core.compile import compiling
from dpgen.errors import DpgenError

__all__ = ["PRECISIONS", "BF16_METHODS", "ENSEMBLE_CONVS", "ENSEMBLE_GENERATORS", "EnsembleCompute", "training_precision",
           "run_precision", "full_precision",
           "at_least_fp32", "noise_dtype", "autocast_enabled", "ensemble_compute", "ensemble_settings"]

log = logging.getLogger("dpgen")

#: the values of ``precision`` (the schema's choices)
PRECISIONS = ("fp32", "tf32", "bf16")

#: the methods that train under precision=bf16 (each trains under it in tests/test_precision.py); the schema
#: refuses precision=bf16 for any other. The ensemble methods (gswgan, dpac, efsgd) run their vmapped members
#: in bf16 by explicit casts (autocast does not reach inside vmap; :func:`ensemble_compute`); gpate's stacked
#: teachers are grouped convolutions outside vmap, which autocast lowers; its batch norm keeps fp32 statistics.
BF16_METHODS = ("dpgan", "gswgan", "dpac", "efsgd", "gpate", "dpaf", "feta", "dpdm")

#: the values of ``ensemble.conv``: the members' convolutions as grouped convolutions (torch's vmap rule for
#: conv2d; G-PATE's stacked teachers) or as one batched matrix product per layer (unfold + bmm)
ENSEMBLE_CONVS = ("grouped", "batched")

#: the values of ``ensemble.generators``: how the stacked warm-up generators of the ensembles' pre-training run.
#: ``vmap``: one batched (grouped) operator per layer for all members; ``loop``: one dense network per member;
#: ``auto``: vmap on accelerators, the loop on a CPU (where it measured 1.2-3x faster).
ENSEMBLE_GENERATORS = ("auto", "vmap", "loop")


@dataclass(frozen=True)
class EnsembleCompute:
    """How the stacked ensembles compute their members' steps (:mod:`dpgen.ensemble`).

    ``dtype``: the members' forward/backward dtype (bf16 under precision=bf16, else fp32); weights, inputs and
    spectral-norm vectors are cast to it inside the functional forward, the master weights, their gradients and
    Adam's state stay fp32. ``compile``: torch.compile the members' step (``compile=true``). ``conv``: one of
    :data:`ENSEMBLE_CONVS`. ``generators``: one of :data:`ENSEMBLE_GENERATORS`.
    """

    dtype: torch.dtype = torch.float32
    compile: bool = False
    conv: str = "grouped"
    generators: str = "auto"


_ENSEMBLE: ContextVar[EnsembleCompute] = ContextVar("dpgen_ensemble_compute", default=EnsembleCompute())


def ensemble_compute() -> EnsembleCompute:
    """The stacked ensembles' settings in effect (fp32, eager, grouped outside :func:`training_precision`)."""
    return _ENSEMBLE.get()


@contextmanager
def ensemble_settings(**changes: object) -> Iterator[EnsembleCompute]:
    """:func:`ensemble_compute` with ``changes`` (fields of :class:`EnsembleCompute`) for the duration."""
    settings = replace(_ENSEMBLE.get(), **changes)  # type: ignore[arg-type]
    if settings.conv not in ENSEMBLE_CONVS:
        raise ValueError(f"ensemble.conv must be one of {', '.join(ENSEMBLE_CONVS)}, got {settings.conv!r}")
    if settings.generators not in ENSEMBLE_GENERATORS:
        raise ValueError(f"ensemble.generators must be one of {', '.join(ENSEMBLE_GENERATORS)}, "
                         f"got {settings.generators!r}")
    token = _ENSEMBLE.set(settings)
    try:
        yield settings
    finally:
        _ENSEMBLE.reset(token)

#: device types autocast may be on for (dpgen runs on cpu or cuda)
_AUTOCAST_DEVICES = ("cpu", "cuda")


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` in this thread (torch >= 2.4 takes the device type; older
    torch has one function per device)."""
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch < 2.4
        return bool(torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled())


@contextmanager
def full_precision() -> Iterator[None]:
    """Autocast off (for the device types where it is on) for the duration: the DP-critical computations
    (norms, clipping, noise, optimizer steps) inside run in the dtypes of their inputs, which the callers make
    at least fp32 (:func:`at_least_fp32`). Outside autocast this does nothing."""
    with ExitStack() as stack:
        for dev in _AUTOCAST_DEVICES:
            if autocast_enabled(dev):
                stack.enter_context(torch.autocast(dev, enabled=False))
        yield


def at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in fp32 if it is a reduced-precision float (bf16, fp16); otherwise ``t`` itself (fp32 and fp64
    unchanged, no copy)."""
    return t.float() if t.is_floating_point() and t.element_size() < 4 else t


def noise_dtype(dtype: torch.dtype | None) -> torch.dtype | None:
    """The dtype Gaussian noise is drawn in for a request of ``dtype``: fp32 for a reduced-precision float,
    else ``dtype`` (None: torch's default dtype)."""
    if dtype is not None and dtype.is_floating_point and torch.finfo(dtype).bits < 32:
        return torch.float32
    return dtype


def _tf32_state() -> tuple[bool, bool, str]:
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision())


def _set_tf32_state(state: tuple[bool, bool, str]) -> None:
    # the matmul precision first: it also sets cuda.matmul.allow_tf32, which the flags then put back. Only the
    # legacy API is used: torch refuses to read the precision once it was set through both APIs.
    matmul, cudnn, precision = state
    torch.set_float32_matmul_precision(precision)
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn


@contextmanager
def training_precision(precision: str, device: torch.device | str, cudnn_benchmark: bool = False,
                       compile: bool = False, ensemble_conv: str = "grouped",
                       ensemble_generators: str = "auto") -> Iterator[None]:
    """The run's ``precision`` and ``cudnn_benchmark`` for the duration (see the module docstring); the
    global flags it sets are restored on exit, so evaluation after training runs in torch's defaults.
    ``compile``, ``ensemble_conv`` and ``ensemble_generators`` (``compile``, ``ensemble.conv``,
    ``ensemble.generators``) set :func:`ensemble_compute` with the
    precision's ensemble dtype, and ``compile`` :func:`dpgen.core.compile.compile_enabled` for the DP-SGD steps.

    ``device`` picks autocast's device type under ``bf16`` (cpu or cuda; bf16 autocast works on both).
    ``cudnn_benchmark`` lets cuDNN time its convolution algorithms for each new shape and keep the fastest:
    faster fixed-shape steps on a GPU, but the choice may differ between runs, so two runs (or a run and its
    resumption) are no longer bit-identical on a GPU. No effect on a CPU.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    dev_type = torch.device(device).type
    if precision == "bf16" and dev_type == "cuda" and not torch.cuda.is_bf16_supported():
        # before Ampere: autocast would refuse with a traceback mid-run
        raise DpgenError("precision=bf16 needs a GPU with bfloat16 support (Ampere or later); use precision=fp32")
    # fp32 reads and writes no TF32 flag at all (torch's state stays exactly as the process set it)
    saved_tf32 = _tf32_state() if precision != "fp32" else None
    saved_benchmark = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = bool(cudnn_benchmark)
        if saved_tf32 is not None:
            _set_tf32_state((True, True, "high"))
            if dev_type != "cuda":
                log.info("precision=%s: TF32 is a format of CUDA GPUs (Ampere and later); device=%s",
                         precision, dev_type)
        autocast = (torch.autocast(dev_type, dtype=torch.bfloat16, cache_enabled=False) if precision == "bf16"
                    else nullcontext())
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        # one switch for every hot step: the DP-SGD steps read compile_enabled(), the ensembles their settings
        with autocast, compiling(bool(compile)), ensemble_settings(dtype=dtype, compile=bool(compile),
                                                                   conv=str(ensemble_conv),
                                                                   generators=str(ensemble_generators)):
            yield
    finally:
        if saved_tf32 is not None:
            _set_tf32_state(saved_tf32)
        torch.backends.cudnn.benchmark = saved_benchmark


def run_precision(cfg: Any, device: torch.device | str) -> ContextManager[None]:
    """:func:`training_precision` with a run config's ``precision``, ``cudnn_benchmark``, ``compile``,
    ``ensemble.conv`` and ``ensemble.generators`` (the pipeline and the GPU benches enter the same settings)."""
    ensemble = cfg.get("ensemble", {})
    return training_precision(str(cfg.precision), device, bool(cfg.cudnn_benchmark), bool(cfg.get("compile", False)),
                              str(ensemble.get("conv", "grouped")), str(ensemble.get("generators", "auto")))
