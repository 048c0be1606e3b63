"""The CPU kernel behind :data:`dpgen.privacy.ghost.FUSED`: a convolution's per-record weight gradients and their
squared norms, with the patches read in place from the padded input (ghost_kernel.cpp; no unfolded copy).

Plain C++ with a C entry point, built on first use by the machine's C++ compiler (``$CXX``, else ``c++``,
``g++`` or ``clang++``; a second or two) into ``$DPGEN_CACHE`` (default ``$XDG_CACHE_HOME/dpgen`` or
``~/.cache/dpgen``) and loaded with ctypes. It is compiled for the machine it runs on (``-march=native``), so
the library's name carries a hash of the source, the flags, the compiler and the CPU's model and instruction
sets: nodes of a cluster that share a home directory each get a library their CPU can run. The library is
written to a temporary name and renamed into place, so processes that build it at once do not see half a file.
Where no compiler is found or the build fails, or ``DPGEN_GHOST_KERNEL=0`` is set, :func:`available` is False
and the ghost clipper takes the same layers without it (one log line says why); the results agree within fp32
rounding either way (tests/test_ghost.py)."""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

__all__ = ["available", "conv_record_grads", "ENV"]

log = logging.getLogger("dpgen")

#: set to 0 to keep the ghost clipper off the kernel (the pure-PyTorch per-layer choice)
ENV = "DPGEN_GHOST_KERNEL"
SOURCE = Path(__file__).with_name("ghost_kernel.cpp")
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-pthread")

#: "lib": the loaded library (None: it did not build); "off": the log line for DPGEN_GHOST_KERNEL=0 was written
_state: dict[str, ctypes.CDLL | None] = {}


def _cpu_signature() -> str:
    """The CPU's model and instruction sets (Linux's /proc/cpuinfo), else what ``platform`` knows."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        keep = [ln for ln in lines if ln.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")]
        return "\n".join(sorted(set(keep)))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def _cache_dir() -> Path:
    root = os.environ.get("DPGEN_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpgen"
    return Path(root) / "kernels"


def _build() -> ctypes.CDLL | None:
    cxx = os.environ.get("CXX") or next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    if cxx is None:
        log.info("grad_backend=ghost: no C++ compiler (c++, g++, clang++ or $CXX) for the convolutions' CPU kernel; "
                 "they take the PyTorch path")
        return None
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
        key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(FLAGS), cxx, version,
                                        _cpu_signature()]).encode()).hexdigest()[:16]
        lib = _cache_dir() / f"ghost_{key}.so"
        if not lib.exists():
            lib.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
            os.close(fd)
            try:
                done = subprocess.run([cxx, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True,
                                      timeout=600)
                if done.returncode != 0:
                    raise RuntimeError((done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1])
                os.replace(tmp, lib)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        dll = ctypes.CDLL(str(lib))
        fn = dll.dpgen_conv_record_grads
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 18
        return dll
    except Exception as e:  # a failed build or load: the PyTorch path, and why
        log.info("grad_backend=ghost: the convolutions' CPU kernel did not build (%s: %s); they take the PyTorch "
                 "path", type(e).__name__, e)
        return None


def available() -> bool:
    """Whether the kernel can run here (built on the first call; False where ``DPGEN_GHOST_KERNEL=0``)."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        if "off" not in _state:  # once per process, as the lines below
            _state["off"] = None
            log.info("grad_backend=ghost: %s=0, the convolutions take the PyTorch path", ENV)
        return False
    if "lib" not in _state:
        _state["lib"] = _build()
        if _state["lib"] is not None:
            log.info("grad_backend=ghost: the convolutions' per-record gradients by dpgen's CPU kernel (%s)",
                     SOURCE.name)
    return _state["lib"] is not None


def conv_record_grads(x: torch.Tensor, gz: torch.Tensor, grads: torch.Tensor, sq: torch.Tensor, rows: int,
                      kernel_size: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int],
                      dilation: tuple[int, int], bias: torch.Tensor | None = None,
                      bias_sq: torch.Tensor | None = None) -> None:
    """Into ``grads`` (records, C·kh·kw, O') each record's weight gradient Σ_t g_t a_tᵀ of a convolution with
    zeros padding and one group (layout (d, o), d in the weight's (c, i, j) order; O' = O rounded up to a
    multiple of 16, the extra columns zero) and into ``sq`` (records,) its squared norm, from the layer's input
    ``x`` (records·rows, C, H, W; a record's ``rows`` consecutive) and output gradient ``gz`` (records·rows, O,
    Ho, Wo), on ATen's intra-op threads; with ``bias`` (records, O') and ``bias_sq`` (records,), each record's bias
    gradient (its output gradients summed over its positions, the extra columns zero) and its squared norm too.
    CPU, fp32, contiguous: anything else is refused (ValueError) before the kernel reads a byte."""
    if not available():
        raise RuntimeError("conv_record_grads: the kernel is not available here")
    if (bias is None) != (bias_sq is None):
        raise ValueError("conv_record_grads: bias and bias_sq come together")
    tensors = {"x": x, "gz": gz, "grads": grads, "sq": sq}
    if bias is not None:
        tensors.update(bias=bias, bias_sq=bias_sq)
    for name, t in tensors.items():
        if t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"conv_record_grads: {name} must be a contiguous CPU fp32 tensor, got {t.dtype} on "
                             f"{t.device} with strides {t.stride()}")
    if x.dim() != 4 or gz.dim() != 4 or grads.dim() != 3 or sq.dim() != 1:
        raise ValueError("conv_record_grads: x and gz are (rows, channels, H, W), grads (records, d, o), sq (records,)")
    records, (n, c, h, w), (ng, o, ho, wo) = sq.shape[0], x.shape, gz.shape
    (kh, kw), d = kernel_size, c * kernel_size[0] * kernel_size[1]
    op = -(-o // 16) * 16
    if rows < 1 or n != records * rows or ng != n or tuple(grads.shape) != (records, d, op) or (
            bias is not None and (tuple(bias.shape) != (records, op) or tuple(bias_sq.shape) != (records,))):
        raise ValueError(f"conv_record_grads: bad shapes: x {tuple(x.shape)}, gz {tuple(gz.shape)}, grads "
                         f"{tuple(grads.shape)}, sq {tuple(sq.shape)}"
                         + ("" if bias is None else f", bias {tuple(bias.shape)}, bias_sq {tuple(bias_sq.shape)}")
                         + f" for {rows} rows per record")
    status = _state["lib"].dpgen_conv_record_grads(
        x.data_ptr(), gz.data_ptr(), grads.data_ptr(), sq.data_ptr(), None if bias is None else bias.data_ptr(),
        None if bias_sq is None else bias_sq.data_ptr(), records, rows, c, h, w, o, ho, wo,
        grads.shape[2], kh, kw, *stride, *padding, *dilation, torch.get_num_threads())
    if status != 0:
        raise ValueError(f"conv_record_grads: the output gradient {ho}x{wo} does not match a {kh}x{kw} convolution "
                         f"of a {h}x{w} input (stride {stride}, padding {padding}, dilation {dilation})")
