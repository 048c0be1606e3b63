"""Device discipline, checked on a CPU: what would crash or stall a CUDA run, found without a GPU.

:func:`watch` runs a method's ``train()`` (usually through ``tiny.train_in_memory``) under a
``TorchFunctionMode`` and a ``TorchDispatchMode`` and records, attributed to the ``dpgen`` file:line
that issued it (the innermost ``dpgen`` frame of the Python stack):

* ``generator-without-device``: a random factory (``torch.randn``, ``rand``, ``randint``, ``randperm``,
  ``normal`` with a size) given ``generator=`` but no ``device=``. It makes a CPU tensor, so a CUDA
  generator (``Run.rng``/``Run.secret_rng`` on ``device=cuda``) raises "Expected a 'cpu' device type for
  generator". Checked everywhere (setup too).
* ``factory-without-device``: a tensor factory (``zeros``, ``ones``, ``full``, ``arange``, ``tensor``,
  ``from_numpy``, ...) without ``device=`` inside a training step: on CUDA a host tensor, copied every step.
* ``sync``: a host synchronisation inside a training step: ``.item()``, ``.cpu()``/``.to("cpu")``,
  ``.tolist()``, ``.numpy()``, ``bool()``/``float()``/``int()`` of a tensor, ``nonzero``, boolean-mask
  indexing, ``masked_select``, ``unique``, ``bincount``, ``repeat_interleave`` without ``output_size``
  (the dispatch mode also catches those issued inside ``backward()`` hooks and torch functions).
* ``global-rng``: a random draw inside a step without ``generator=`` (not the run's seeded streams).
* ``restored-off-device`` (resume only, see :func:`checkpoint_tensors_marked`): a tensor restored from a
  checkpoint used in computation before it was moved to the run's device.
* ``graph-in-grad``: an optimizer steps on a parameter whose ``.grad`` carries an autograd graph (it has a
  ``grad_fn``). The graph, and every activation it saved, stays alive until the next step replaces the gradient:
  one step's forward held in memory for nothing. Checked everywhere (setup too), at the ``dpgen`` frame that
  called the optimizer.

A "training step" is the code between two ``Run.step_done`` calls (after ``Run.start``); the logging and
checkpointing inside ``Run.step_done`` / ``Run.finish`` are not counted (they happen every ``log_every`` /
``checkpoint_every`` steps, which the rules allow). Only operations issued by ``dpgen`` code count as its
own: a factory inside a library is the library's business, a sync inside a library called from ``dpgen``
is counted at the ``dpgen`` call site (a GPU stalls the same), except in ``torch/optim`` (its step counters
are CPU tensors by design, whatever the parameters' device).

Everything runs on the CPU, so the harness tracks which tensors a CUDA run would keep on the host: results
of ``.cpu()``, of factories without ``device=`` and of draws from a CPU generator (``torch.Generator()``,
not a run stream or a secret generator) inside a step become :class:`Host` tensors, and reading them back is
no sync.
Checkpoint tensors of a resumed run become :class:`Restored` ones: a stand-in for "still on the
checkpoint's device" until ``.to(device)`` or a copy into a device tensor places them.

Limits: a ``torch.device`` object cannot be told from the run's device on a CPU, so ``.to(x.device)`` is
never a sync and only a literal ``"cpu"`` is; host tensors are tracked inside steps only.
"""
from __future__ import annotations

import os
import sys
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import dpgen

DPGEN_DIR = os.path.dirname(os.path.abspath(dpgen.__file__)) + os.sep
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
REPO_DIR = os.path.dirname(DPGEN_DIR.rstrip(os.sep)) + os.sep
_HERE = os.path.abspath(__file__)
_OVERRIDES = os.path.abspath(torch.overrides.__file__)
# Library code whose host syncs are not GPU stalls (CPU-resident by design) or not ours to count.
_EXEMPT_ORIGINS = (TORCH_DIR + "optim" + os.sep,)
#: code whose operations are attributed (dpgen; a harness test adds its own toy file)
ROOTS: list[str] = [DPGEN_DIR]

KINDS = ("generator-without-device", "factory-without-device", "sync", "global-rng", "restored-off-device",
         "graph-in-grad")


@dataclass(frozen=True)
class Violation:
    kind: str
    site: str  # dpgen/<file>.py:<line>, the innermost dpgen frame
    op: str  # e.g. Tensor.item, torch.randn, aten.nonzero
    via: str = ""  # the library file:line that issued it, when not dpgen itself

    def __str__(self) -> str:
        return f"{self.site} {self.kind} {self.op}" + (f" (via {self.via})" if self.via else "")


def _short(filename: str, line: int) -> str:
    path = os.path.abspath(filename)
    if path.startswith(REPO_DIR):
        path = path[len(REPO_DIR):]
    elif "site-packages" + os.sep in path:
        path = path.split("site-packages" + os.sep, 1)[1]
    return f"{path}:{line}"


def locate() -> tuple[str | None, str | None, bool]:
    """(dpgen site, origin, exempt) of the operation being handled.

    origin is the code that asked for the operation: the first frame outside this harness, past torch's
    ``handle_torch_function`` and the torch wrapper that called it (torch.nn.functional, Tensor.__format__,
    ...). site is the innermost frame in dpgen. exempt: the origin is CPU-by-design library code.
    """
    f = sys._getframe(1)
    origin = site = None
    exempt = skip_wrapper = False
    while f is not None:
        fn = f.f_code.co_filename
        if fn == _HERE:
            pass
        elif fn == _OVERRIDES:
            skip_wrapper = True
        elif skip_wrapper:
            skip_wrapper = False
        else:
            if origin is None:
                origin = _short(fn, f.f_lineno)
                exempt = fn.startswith(_EXEMPT_ORIGINS)
            if fn.startswith(tuple(ROOTS)):
                site = _short(fn, f.f_lineno)
                break
        f = f.f_back
    return site, origin, exempt


def _name(func: Any) -> str:
    if isinstance(func, torch._ops.OpOverload):
        return f"aten.{func.overloadpacket.__name__}"
    qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or str(func)
    for prefix, short in (("_VariableFunctionsClass.", "torch."), ("TensorBase.", "Tensor."),
                          ("getset_descriptor.", "Tensor.")):
        if qual.startswith(prefix):
            return short + qual[len(prefix):]
    module = getattr(func, "__module__", "") or ""
    if module in ("torch.functional", "torch._C._nn", "torch.nn.functional"):
        return ("torch." if module == "torch.functional" else "F.") + qual
    return qual if qual.startswith(("Tensor.", "torch.")) else f"{module}.{qual}"


_RANDOM_FACTORIES = {"torch.randn", "torch.rand", "torch.randint", "torch.randperm", "torch.normal"}
_FACTORIES = _RANDOM_FACTORIES | {
    "torch.zeros", "torch.ones", "torch.full", "torch.empty", "torch.empty_strided", "torch.arange", "torch.linspace",
    "torch.logspace", "torch.eye", "torch.tensor", "torch.as_tensor", "torch.from_numpy", "torch.scalar_tensor",
    "torch.tril_indices", "torch.triu_indices"}
_GLOBAL_RNG = _RANDOM_FACTORIES | {
    "torch.bernoulli", "torch.multinomial", "torch.rand_like", "torch.randn_like", "torch.randint_like",
    "torch.poisson", "Tensor.normal_", "Tensor.uniform_", "Tensor.bernoulli_", "Tensor.random_",
    "Tensor.exponential_", "Tensor.geometric_", "Tensor.cauchy_", "Tensor.log_normal_", "Tensor.bernoulli",
    "Tensor.multinomial"}
_SYNCS = {"Tensor.item", "Tensor.tolist", "Tensor.cpu", "Tensor.numpy", "Tensor.__array__", "Tensor.__bool__",
          "Tensor.__float__", "Tensor.__int__", "Tensor.__index__", "Tensor.__format__", "Tensor.__repr__",
          "Tensor.nonzero", "torch.nonzero", "Tensor.argwhere", "torch.argwhere", "Tensor.masked_select",
          "torch.masked_select", "Tensor.unique", "torch.unique", "torch.unique_consecutive", "torch.bincount",
          "Tensor.bincount", "torch.equal", "Tensor.equal", "torch.allclose", "Tensor.allclose"}
# aten ops that make the host wait for the device (data-dependent shapes or a value read back)
_ATEN_SYNCS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique", "_unique2", "unique_dim",
               "unique_consecutive", "bincount", "equal", "is_nonzero"}


def _is_cpu(dev: Any) -> bool:
    if isinstance(dev, torch.Tensor):
        return dev.device.type == "cpu"
    try:
        return torch.device(dev).type == "cpu"
    except (TypeError, RuntimeError):
        return False


def _bool_index(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _sync_kind(name: str, args: tuple, kwargs: dict) -> bool:
    """True when the call reads device data back to the host (or waits for it)."""
    if name in _SYNCS:
        return True
    if name == "Tensor.to":  # only a literal "cpu": a torch.device taken from a tensor is the run's device here
        dev = kwargs.get("device", args[1] if len(args) > 1 else None)
        return isinstance(dev, str) and _is_cpu(dev)
    if name in ("Tensor.__getitem__", "Tensor.__setitem__", "Tensor.index_put_", "Tensor.index_put"):
        return len(args) > 1 and _bool_index(args[1])
    if name in ("torch.where",):
        return len(args) + len(kwargs) == 1  # where(cond) is nonzero(cond)
    if name in ("torch.repeat_interleave", "Tensor.repeat_interleave"):
        repeats = kwargs.get("repeats", args[1] if len(args) > 1 else args[0] if name.startswith("torch") else None)
        return isinstance(repeats, torch.Tensor) and repeats.numel() > 1 and kwargs.get("output_size") is None
    return False


def _factory_without_device(name: str, args: tuple, kwargs: dict) -> bool:
    if kwargs.get("device") is not None:
        return False
    if name == "torch.as_tensor":
        return not isinstance(args[0] if args else kwargs.get("data"), torch.Tensor)
    if name == "torch.normal":  # normal(mean, std) with a tensor takes its device from the tensor
        return not any(isinstance(a, torch.Tensor) for a in (*args[:2], kwargs.get("mean"), kwargs.get("std")))
    return True


@dataclass
class Report:
    """What one method did: violations per training step (and in setup), counted."""

    method: str = ""
    steps: list[Counter] = field(default_factory=list)
    setup: Counter = field(default_factory=Counter)
    restored: Counter = field(default_factory=Counter)

    def all(self) -> Counter:
        total = Counter(self.setup) + self.restored
        for c in self.steps:
            total.update(c)
        return total

    def count(self, kind: str) -> int:
        return sum(n for v, n in self.all().items() if v.kind == kind)

    def syncs_per_step(self) -> list[int]:
        return [sum(n for v, n in c.items() if v.kind == "sync") for c in self.steps]

    def max_syncs(self) -> int:
        return max(self.syncs_per_step(), default=0)

    def problems(self, sync_budget: int) -> list[str]:
        """Everything that breaks the rules: any violation but syncs, and syncs above ``sync_budget`` per step."""
        out = [f"{v} x{n}" for v, n in sorted(self.all().items(), key=str) if v.kind != "sync"]
        if self.max_syncs() > sync_budget:
            out.append(f"{self.max_syncs()} host syncs in one step > budget {sync_budget}")
        return out

    def problem_kinds(self, sync_budget: int) -> set[tuple[str, str]]:
        """(file, kind) of every rule broken (syncs only when over budget): a line-number-free summary."""
        return {(v.site.rsplit(":", 1)[0], v.kind) for v in self.all()
                if v.kind != "sync" or self.max_syncs() > sync_budget}

    def table(self) -> str:
        """One line per (site, kind, op): count per step (or 'setup'/'resume')."""
        n = max(len(self.steps), 1)
        lines = [f"{self.method}: {len(self.steps)} steps, host syncs per step {self.syncs_per_step()}"]
        per_step = Counter()
        for c in self.steps:
            per_step.update(c)
        for v, k in sorted(per_step.items(), key=lambda vk: str(vk[0])):
            lines.append(f"  {v}  {k / n:.3g}/step")
        for v, k in sorted(self.setup.items(), key=lambda vk: str(vk[0])):
            lines.append(f"  {v}  x{k} in setup")
        for v, k in sorted(self.restored.items(), key=lambda vk: str(vk[0])):
            lines.append(f"  {v}  x{k} after resume")
        return "\n".join(lines)


class _Recorder:
    def __init__(self, report: Report) -> None:
        self.report = report
        self.in_step = False
        self.paused = 0
        self.in_sync = 0
        self.current: Counter = Counter()
        self.run_generators: list[torch.Generator] = []

    def is_run_generator(self, g: torch.Generator) -> bool:
        from dpgen.privacy.randomness import SecretGenerator

        # secret generators live on the run's device (the run's secret streams and their forks)
        return isinstance(g, SecretGenerator) or any(g is r for r in self.run_generators)

    def add(self, kind: str, op: str, in_step_only: bool, direct_only: bool) -> bool:
        """Record a violation of ``kind`` by the operation being handled; True if dpgen issued it itself."""
        if self.paused or (in_step_only and not self.in_step):
            return False
        site, origin, exempt = locate()
        direct = site is not None and origin == site
        if site is None or exempt or (direct_only and not direct):
            return direct
        v = Violation(kind, site, op, "" if direct else (origin or ""))
        (self.current if self.in_step else self.report.setup)[v] += 1
        return direct

    def add_at_site(self, kind: str, op: str) -> None:
        """Record a violation of ``kind`` at the innermost dpgen frame, whatever library code lies in between
        (an optimizer's step is called by dpgen but runs in torch.optim, whose origin is exempt from ``add``)."""
        if self.paused:
            return
        site, origin, _ = locate()
        if site is not None:
            v = Violation(kind, site, op, "" if origin == site else (origin or ""))
            (self.current if self.in_step else self.report.setup)[v] += 1

    # Run hooks
    def start(self) -> None:
        self.in_step, self.current = True, Counter()

    def step_done(self) -> None:
        if self.in_step:
            self.report.steps.append(self.current)
        self.current = Counter()

    def finish(self) -> None:
        self.in_step = False


def _operand(name: str, args: tuple, kwargs: dict) -> Any:
    """The tensor a sync would read (the first tensor argument)."""
    return next((a for a in _flat(args, kwargs) if isinstance(a, torch.Tensor)), None)


class _FunctionMode(TorchFunctionMode):
    def __init__(self, rec: _Recorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        rec = self.rec
        host_result = False
        if name in _FACTORIES and _factory_without_device(name, args, kwargs):
            gen = kwargs.get("generator")
            if gen is not None and not rec.is_run_generator(gen):
                site, origin, _ = locate()  # a CPU generator: a host tensor on purpose (feta's augmentation)
                host_result = site is not None and site == origin
            elif gen is not None:
                rec.add("generator-without-device", name, in_step_only=False, direct_only=True)
            else:
                host_result = rec.add("factory-without-device", name, in_step_only=True, direct_only=True)
        if name in _GLOBAL_RNG and kwargs.get("generator") is None:
            rec.add("global-rng", name, in_step_only=True, direct_only=True)
        # one_hot's CPU kernel reads min/max back to check the labels; given num_classes, its CUDA kernel does not
        quiet = name.endswith("one_hot") and int(kwargs.get("num_classes", args[1] if len(args) > 1 else -1)) > 0
        sync = not quiet and _sync_kind(name, args, kwargs) and not isinstance(_operand(name, args, kwargs), Host)
        if sync:
            rec.add("sync", name, in_step_only=True, direct_only=False)
            host_result = host_result or name in ("Tensor.cpu", "Tensor.to")
        rec.in_sync += int(quiet or sync)  # the dispatch mode must not count this call's aten ops again
        try:
            out = func(*args, **kwargs)
        finally:
            rec.in_sync -= int(quiet or sync)
        # host tensors are tracked inside steps only: setup moves its host tensors wholesale (Module.to), which
        # the tracking cannot follow through module attributes
        return _as_host(out) if host_result and rec.in_step and not rec.paused else out


class _DispatchMode(TorchDispatchMode):
    """Catches syncs the function mode cannot see (inside backward hooks and torch's own functions)."""

    def __init__(self, rec: _Recorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.rec
        if rec.in_step and not rec.in_sync and not rec.paused and not any(
                isinstance(a, Host) for a in _flat(args, kwargs)):
            op = func.overloadpacket.__name__
            sync = op in _ATEN_SYNCS or (
                op in ("index", "index_put", "index_put_") and len(args) > 1
                and any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] or ())
            ) or (op == "repeat_interleave" and isinstance(args[0], torch.Tensor) and args[0].dim() > 0
                  and kwargs.get("output_size") is None and len(args) == 1)
            if sync:
                rec.add("sync", f"aten.{op}", in_step_only=True, direct_only=False)
        return func(*args, **kwargs)


@contextmanager
def _run_hooks(rec: _Recorder) -> Iterator[None]:
    """Tell the recorder where training steps begin and end; pause it inside logging and checkpointing."""
    import dpgen.core.run as run_mod
    from dpgen.core.run import Run

    orig_start, orig_rng, orig_close = Run.start, Run.rng, Run.close

    def rng(self, *a, **k):
        g = orig_rng(self, *a, **k)
        rec.run_generators.append(g)  # on the run's device: draws from it need device=
        return g

    def start(self, *a, **k):
        rec.start()
        return orig_start(self, *a, **k)

    def close(self, *a, **k):
        rec.finish()  # a run stopped by debug.stop_after never reaches finish()
        return orig_close(self, *a, **k)

    def paused(orig, mark):
        """``orig`` (logging, checkpointing) not counted, after ``mark`` closes the step or the run."""
        def wrapper(self, *a, **k):
            mark()
            rec.paused += 1
            try:
                return orig(self, *a, **k)
            finally:
                rec.paused -= 1
        return wrapper

    step_done, finish = paused(Run.step_done, rec.step_done), paused(Run.finish, rec.finish)
    orig_save = run_mod.atomic_save

    def save(obj, path, *a, **k):  # checkpoints hold plain tensors (they are loaded with weights_only=True)
        return orig_save(_plain(obj), path, *a, **k)

    def graph_in_grad(opt, args, kwargs) -> None:
        if any(p.grad is not None and p.grad.grad_fn is not None for g in opt.param_groups for p in g["params"]):
            rec.add_at_site("graph-in-grad", f"{type(opt).__name__}.step")

    patches = [mock.patch.object(run_mod, "atomic_save", save)] + [
        mock.patch.object(Run, name, fn) for name, fn in (("start", start), ("step_done", step_done), ("finish", finish),
                                                          ("close", close), ("rng", rng))]
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    hook = register_optimizer_step_pre_hook(graph_in_grad)
    try:
        with ExitStack() as stack:
            for p in patches:
                stack.enter_context(p)
            yield
    finally:
        hook.remove()


@contextmanager
def watch(report: Report, dispatch: bool = True, roots: tuple[str, ...] = ()) -> Iterator[Report]:
    """Record ``report`` for everything trained inside the block (``roots``: more code to attribute, besides dpgen)."""
    rec = _Recorder(report)
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(sys.modules[__name__], "ROOTS", [DPGEN_DIR, *roots]))
        stack.enter_context(_run_hooks(rec))
        stack.enter_context(_FunctionMode(rec))
        if dispatch:
            stack.enter_context(_DispatchMode(rec))
        _ACTIVE.append(rec)
        try:
            yield report
        finally:
            _ACTIVE.pop()
            rec.finish()


_ACTIVE: list[_Recorder] = []


# ---- host tensors: CPU on purpose, and restored ones that must be placed on the run's device -------------
_MOVE_NAMES = {"Tensor.to", "Tensor.cuda", "Tensor.copy_", "Tensor.__setitem__"}
# ops that neither compute with nor move a tensor: metadata, serialisation, views and copies that stay put,
# and reading a value back to the host (how a restored scalar is restored)
_KEEP = {"Tensor.__get__", "Tensor.size", "Tensor.dim", "Tensor.numel", "Tensor.stride", "Tensor.is_floating_point",
         "Tensor.is_complex", "Tensor.element_size", "Tensor.nelement", "Tensor.data_ptr", "Tensor.is_contiguous",
         "Tensor.__len__", "Tensor.__reduce_ex__", "Tensor.__deepcopy__", "Tensor.__repr__", "Tensor.__format__",
         "Tensor.__hash__", "Tensor.storage", "Tensor.untyped_storage", "Tensor._typed_storage", "Tensor.__getitem__",
         "Tensor.detach", "Tensor.clone", "Tensor.view", "Tensor.reshape", "Tensor.contiguous", "Tensor.requires_grad_",
         "Tensor.__setstate__", "Tensor.storage_offset", "Tensor.is_shared", "Tensor.share_memory_",
         "Tensor.get_device", "Tensor.has_names", "Tensor._is_view", "Tensor.__array__", "Tensor.numpy",
         "Tensor.tolist", "Tensor.item", "Tensor.cpu", "Tensor.__float__", "Tensor.__int__", "Tensor.__bool__",
         "Tensor.__index__"}


def _moves(name: str, args: tuple, kwargs: dict) -> bool:
    """The call puts a host tensor on the run's device (or copies it into a tensor that is there)."""
    if name == "Tensor.cuda":
        return True
    if name in ("Tensor.copy_", "Tensor.__setitem__"):
        return not isinstance(args[0], Host)
    if name == "Tensor.to":  # to(device), to(tensor), to(device=...); a literal "cpu" keeps it on the host
        dev = kwargs.get("device", kwargs.get("other"))
        dev = dev if dev is not None else next((a for a in args[1:] if isinstance(a, (str, torch.device, torch.Tensor))),
                                               None)
        if isinstance(dev, torch.Tensor):
            return not isinstance(dev, Host)
        return dev is not None and not (isinstance(dev, str) and _is_cpu(dev))
    return False


class Host(torch.Tensor):
    """A tensor that lives on the host even in a CUDA run (the CPU harness cannot tell by its device).

    Made by ``.cpu()``, by factories without ``device=`` and by draws from a CPU generator (feta's
    augmentation runs on the CPU on purpose). Results of ops on it stay ``Host``; ``.to(device)``,
    ``.cuda()`` and copies into device tensors give plain tensors. Reading it back (``.item()``) is no sync.
    """

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        if name in _MOVE_NAMES and _moves(name, args, kwargs):
            return _plain_call(func, args, kwargs)
        return super().__torch_function__(func, types, args, kwargs)

    def __deepcopy__(self, memo):
        with torch._C.DisableTorchFunctionSubclass():
            return self.detach().clone().requires_grad_(self.requires_grad).as_subclass(type(self))


class Restored(Host):
    """A tensor as a checkpoint hands it back: on the checkpoint's (CPU) device, not yet on the run's.

    Stands in for a second device on a CPU-only machine: ``.to(device)``, ``.cuda()`` and copies into
    existing tensors (``copy_``, ``load_state_dict``, ``t[...] = restored``) give plain tensors. A
    ``restored-off-device`` violation is dpgen code computing with it directly, or any code mixing it with a
    device tensor (``exp_avg.lerp_(grad)`` in Adam: a crash on CUDA). Libraries may compute on restored
    tensors alone (spectral_norm's load hook does): that is host work, and the result stays ``Restored``.
    0-dim tensors are exempt (torch mixes CPU scalars with CUDA tensors; Adam keeps its step counts on the
    CPU), and reading a value back (``.item()``, ``.tolist()``) is how scalars are restored.
    """

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        if name in _KEEP:
            return torch.Tensor.__torch_function__.__func__(cls, func, types, args, kwargs)
        if name in _MOVE_NAMES and _moves(name, args, kwargs):
            return _plain_call(func, args, kwargs)
        operands = [a for a in _flat(args, kwargs) if isinstance(a, torch.Tensor)]
        if not any(isinstance(a, Restored) and a.dim() > 0 for a in operands):
            return _plain_call(func, args, kwargs)
        site, origin, _ = locate()
        mixed = any(not isinstance(a, Host) and a.dim() > 0 for a in operands)
        if origin == site or mixed:
            v = Violation("restored-off-device", site or "?", name, "" if origin == site else (origin or ""))
            for rec in _ACTIVE:
                rec.report.restored[v] += 1
            return _plain_call(func, args, kwargs)
        return torch.Tensor.__torch_function__.__func__(cls, func, types, args, kwargs)


def _flat(args: tuple, kwargs: dict) -> Iterator[Any]:
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        elif isinstance(a, dict):
            yield from a.values()
        else:
            yield a


def _plain_call(func, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` on the very same tensor objects (autograd identity kept), results as plain tensors."""
    with torch._C.DisableTorchFunctionSubclass():
        out = func(*args, **kwargs)
    if isinstance(out, Host):  # .to() on the right device returns self: on a GPU that would be a moved copy
        out = out.as_subclass(torch.Tensor)
    return out


def _as_host(out: Any) -> Any:
    if isinstance(out, torch.Tensor) and not isinstance(out, Host):
        return out.as_subclass(Host)
    return out


def _plain(obj: Any) -> Any:
    if isinstance(obj, Host):
        return obj.as_subclass(torch.Tensor)
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    return obj


def mark_restored(obj: Any) -> Any:
    """``obj`` with every tensor (in nested dicts/lists/tuples) turned into :class:`Restored`."""
    if isinstance(obj, torch.Tensor):
        return obj.as_subclass(Restored)
    if isinstance(obj, dict):
        return {k: mark_restored(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(mark_restored(v) for v in obj)
    return obj


@contextmanager
def checkpoint_tensors_marked() -> Iterator[None]:
    """Resumed runs see their checkpoint's method state as :class:`Restored` tensors (RNG states stay plain:
    generators take CPU byte tensors on every device)."""
    import dpgen.core.run as run_mod

    orig = run_mod.load_checkpoint

    def load(path):
        ckpt = orig(path)
        return {**ckpt, "state": mark_restored(ckpt["state"])}

    with mock.patch.object(run_mod, "load_checkpoint", load):
        yield


# ---- the whole round: a few steps, a stop, a resume --------------------------------------------------------
def check_method(method: str, tmp: Path, stop_after: int, *overrides: str, data=None, dispatch: bool = True,
                 eps: float | str = 10.0) -> Report:
    """Train ``method`` on tiny settings under the watch, stop after ``stop_after`` steps, resume to the end
    with the checkpoint's tensors marked :class:`Restored`; one report for both halves."""
    from dpgen.core.run import TrainingInterrupted
    from tiny import train_in_memory

    report = Report(method)
    big = 10**9  # no log/checkpoint lines inside the measured steps
    kw = dict(data=data, eps=eps, log_every=big, checkpoint_every=big)
    with watch(report, dispatch=dispatch):
        try:
            train_in_memory(method, tmp, *overrides, stop_after=stop_after, **kw)
        except TrainingInterrupted:
            pass
        else:
            raise AssertionError(f"{method}: finished before stop_after={stop_after}; lower it")
        with checkpoint_tensors_marked():
            train_in_memory(method, tmp, *overrides, resume=True, **kw)
    return report
