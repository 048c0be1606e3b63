"""One GPU check: the card's bf16 matmul rate, then four methods at profile=paper under every precision/compile.

Prints ONE table last (stdout; progress goes to stderr before it): a caption with the torch, CUDA, cuDNN and
GPU names, a first row with the measured bf16 matmul rate of the card (``torch.matmul`` of two n x n bf16
matrices, the reference for the "% matmul" column), then one row per (method, variant):

- methods: feta, gswgan's discriminator pre-training (its dominant cost: K discriminators x 2000 warm-up
  iterations), dpgan and gpate, each on its ``profile=paper`` config (fmnist by default);
- variants: ``precision=fp32|tf32|bf16`` x ``compile=false|true`` (config overrides, dpgen/core/precision.py),
  all in this one process, the fp32/compile-off baseline first;
- columns: s/step (gswgan: s per warm-up iteration of one chunk of pairs; the mean over the steps the row's
  budget share allowed after the warm-up steps), achieved TFLOP/s (FLOPs counted by
  ``torch.utils.flop_counter``, grouped convolutions per group, over one untimed step / s/step), that rate as a
  percentage of the measured bf16 matmul rate, peak memory (``torch.cuda.max_memory_allocated``; on a CPU the
  process's max RSS, which only grows), and the full-run estimate (gswgan: the full pre-training).

Each row is bench/gpu_profile.py's :func:`profile_one` (the same timing, FLOP counting and extrapolation),
stopped by its budget share. A variant the config refuses (a precision the method does not support, a
``compile`` key the schema lacks) or that fails while training gives a row saying why, and the check goes on.

``--budget M`` (minutes, from the start of this script) is divided among the rows that can run, weighted
(compile-on rows weigh double: compilation happens inside them; a feta, dpdm or gswgan row weighs
:data:`METHOD_WEIGHT` times a dpgan row: one paper-sized DP-SGD step takes about 20 s on an H200); a row's
unspent share passes on to the rest, and a row left with less than a few seconds says "skipped". Before the
first row, while some row's planned share is below its method's minimum (:data:`MIN_ROW_S`: 100 s for feta and
dpdm, 5 s otherwise), the lowest-priority variant is left out (:data:`PRIORITY`: tf32 with compile first, the
fp32 baselines last), and its row says "skipped (budget)". A few seconds stay in reserve for the table.
``--variants m:precision:compile[:KEY=VALUE+KEY=VALUE],...`` picks the rows one by one instead of methods x
precisions x compile; a row's optional fourth field adds its own Hydra overrides (``+`` between them), so a setting is
timed beside today's in one process, e.g. ``gswgan:bf16:false,gswgan:bf16:false:ensemble.conv=batched``. The row's
notes start with them.
``--set KEY=VALUE`` (repeatable) adds a Hydra override to every row whose method has the key (e.g.
``--set feta.cuda_graph=true``), and the caption lists them: a setting is timed beside today's by running the check
twice in one call, with and without it.

``--kernels N``: for each method's fp32/compile-off row, torch.profiler (CUDA activity on CUDA, CPU otherwise)
records one untimed step (the last warm-up step of the main phase; gswgan: the second pre-training warm-up
iteration, then left out of its timing) and the top N kernels by self device time are printed, each with its
share of the row's s/step, as lines BEFORE the table (which stays last); ``--out``'s JSON keeps them.

    python bench/gpu_check.py [--budget 7] [--out DIR]        # CUDA, fmnist profile=paper (docs/performance.md)
    python bench/gpu_check.py --device cpu --tiny              # CPU smoke test: tests/tiny.py's configs on digits
    python bench/gpu_check.py --kernels 8 --variants feta:fp32:false,feta:bf16:false,dpgan:fp32:false
"""
from __future__ import annotations

import time

T_START = time.perf_counter()  # the budget counts from here: the imports below are part of the check's time

import argparse  # noqa: E402
import contextlib  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Iterator  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_profile as gp  # noqa: E402  (bench/gpu_profile.py: the per-method profile, shared)

METHODS = ("feta", "gswgan", "dpgan", "gpate")
PRETRAIN_ROWS = ("gswgan",)  # rows that report the ensemble pre-training, not the generator steps
PRECISIONS = ("fp32", "tf32", "bf16")
COMPILES = ("false", "true")
COLUMNS = ("method", "precision", "compile", "s/step", "TFLOP/s", "% matmul", "peak GB", "full run h", "notes")
COMPILE_WEIGHT = 2.0  # a compile-on row's share of the budget relative to a compile-off row
# A method's weight in the budget split: one feta DP-SGD step at profile=paper takes about 20 s on an H200, plus
# its first phase, so its rows need several times a dpgan or gpate row's share to time any step at all.
# GS-WGAN's pre-training rows need a few 1.3-1.9 s warm-up iterations after building 1000 discriminators.
METHOD_WEIGHT = {"feta": 6.0, "dpdm": 6.0, "gswgan": 2.0}
# A method's least useful share (s): below it the row is skipped before the check starts ("skipped (budget)"),
# lowest-priority variants first, so that the rows that do run time steps. feta on an H200 (2026-11-30): 3 s of
# setup and first phase, a first DP-SGD step of 28 s, then 15-16 s a step; 2 warm-up and 3 timed steps take about
# 91-94 s (with 60 s its rows timed one step).
MIN_ROW_S = {"feta": 100.0, "dpdm": 100.0}
# (precision, compile) from most to least wanted: the baseline, then the variants last time's figures made
# interesting (bf16 helped the ensembles and feta), then the rest
PRIORITY = (("fp32", "false"), ("bf16", "false"), ("bf16", "true"), ("tf32", "false"), ("fp32", "true"),
            ("tf32", "true"))
KERNEL_NAME_CHARS = 90  # a kernel's name is cut here in its line (the JSON file keeps it whole)
NOTE_CHARS = 160  # a failure's reason is cut here in the table (the JSON file keeps it whole)


# ---- the budget --------------------------------------------------------------------------------------------

def row_weight(compile_: str, method: str = "") -> float:
    """A row's weight in the budget split: compile-on rows pay for compilation inside their share, and a method
    with slow steps (:data:`METHOD_WEIGHT`) needs more time per row."""
    return (COMPILE_WEIGHT if compile_ == "true" else 1.0) * METHOD_WEIGHT.get(method, 1.0)


def method_min_s(method: str, tiny: bool) -> float:
    """The least share a row of ``method`` runs with (:data:`MIN_ROW_S`; the tiny configs need seconds only)."""
    return min_row_s(tiny) if tiny else MIN_ROW_S.get(method, min_row_s(tiny))


def priority(precision: str, compile_: str) -> int:
    """A variant's rank in :data:`PRIORITY` (0 = most wanted; unlisted variants last)."""
    try:
        return PRIORITY.index((precision, compile_))
    except ValueError:
        return len(PRIORITY)


def plan_rows(rows: list[tuple[str, ...]], available_s: float, tiny: bool) -> list[tuple[str, ...]]:
    """The (method, precision, compile[, overrides]) rows to skip so that every other row's planned share (``available_s``
    split by :func:`row_weight`) reaches its method's minimum (:func:`method_min_s`). While some row falls
    short, the lowest-priority row of all (:data:`PRIORITY`; among equals the heaviest, then the last) is
    dropped: tf32 with compile goes first, the fp32 baselines last."""
    keep = list(rows)
    skipped: list[tuple[str, ...]] = []
    while keep:
        total = sum(row_weight(c, m) for m, _, c, *_ in keep)
        if all(available_s * row_weight(c, m) / total >= method_min_s(m, tiny) for m, _, c, *_ in keep):
            break
        victim = max(keep, key=lambda r: (priority(r[1], r[2]), row_weight(r[2], r[0]), keep.index(r)))
        keep.remove(victim)
        skipped.append(victim)
    return skipped


def budget_share(left_s: float, weight: float, weights_left: float) -> float:
    """This row's seconds: its weight's share of the time left (rows before it that finished early or failed
    at once leave theirs to the rest)."""
    if weights_left <= 0:
        return 0.0
    return max(0.0, left_s) * weight / weights_left


def reserve_s(budget_s: float) -> float:
    """Seconds kept back from the rows: cleanup after the last row and the table."""
    return max(3.0, 0.03 * budget_s)


def min_row_s(tiny: bool) -> float:
    """Below this share a row is skipped: it could not get past its setup."""
    return 1.0 if tiny else 5.0


# ---- the card ----------------------------------------------------------------------------------------------

def environment(device: torch.device) -> dict:
    """torch, CUDA and cuDNN versions and the device's name."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"torch": torch.__version__, "cuda": torch.version.cuda or "none", "cudnn": cudnn,
            "device": gp._device_name(device), "python": sys.version.split()[0]}


def matmul_rate(device: torch.device, n: int, seconds: float) -> dict:
    """The bf16 matmul rate of ``device``: ``n`` x ``n`` by ``n`` x ``n`` products for about ``seconds`` s
    after three warm-up products; 2 n^3 FLOPs each."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
    out = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(3):
        torch.matmul(a, b, out=out)
    gp._sync(device)
    t0 = time.perf_counter()
    reps, batch = 0, 1
    while True:
        for _ in range(batch):
            torch.matmul(a, b, out=out)
        reps += batch
        gp._sync(device)
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            break
        batch = min(2 * batch, 256)
    per = elapsed / reps
    return {"method": f"bf16 matmul n={n}", "precision": "bf16", "compile": "", "s/step": per,
            "TFLOP/s": 2 * n**3 / per / 1e12, "% matmul": 100.0, "peak GB": gp._peak_gb(device),
            "notes": f"torch.matmul, {reps} products timed"}


# ---- one variant -------------------------------------------------------------------------------------------

def compile_known(dataset: str, eps: str, tiny: bool) -> bool:
    """Whether the composed config has a ``compile`` key (the option may not exist in this checkout)."""
    profile, base = gp.base_config("dpgan", tiny)
    return "compile" in gp._compose("dpgan", dataset, eps, profile, base)


def variant_overrides(precision: str, compile_: str, has_compile: bool) -> list[str]:
    """The config overrides of one variant. Without a ``compile`` key, compile off is the default (no
    override) and compile on cannot be asked for: :func:`preflight` then says so."""
    out = [f"precision={precision}"]
    if has_compile or compile_ == "true":
        out.append(f"compile={compile_}")
    return out


def preflight(method: str, dataset: str, eps: str, tiny: bool, overrides: list[str]) -> str | None:
    """Why the config refuses this variant (composition or the schema's rules), or None if it is valid."""
    from dpgen.core.pipeline import validate
    from dpgen.core.schema import explain_config_error
    from dpgen.errors import DpgenError

    profile, base = gp.base_config(method, tiny)
    given = dict(o.split("=", 1) for o in overrides)
    try:
        cfg = gp._compose(method, dataset, eps, profile, [*base, *overrides])
    except Exception as exc:  # noqa: BLE001 - Hydra's composition errors, as one line
        why = str(explain_config_error(exc, given))
        key = next((k for k in given if f"unknown key {k};" in why), None)
        return f"{key}: key not in schema" if key else why
    try:
        validate(cfg)
    except DpgenError as exc:
        return str(exc)
    return None


@contextlib.contextmanager
def counting_compile() -> Iterator[list[int]]:
    """Counts the calls of ``torch.compile`` (``nn.Module.compile`` goes through it) while a row runs, so that
    a compile-on row that never compiled says so instead of passing for a compiled measurement."""
    calls = [0]
    original = torch.compile

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    torch.compile = counted
    try:
        yield calls
    finally:
        torch.compile = original


def warm_imports(methods: list[str]) -> None:
    """Import the methods' modules before the first row, so that no row's budget pays for them."""
    import importlib

    from dpgen.core.methods import load_method

    for m in methods:
        load_method(m)
    importlib.import_module("dpgen.gswgan.train")  # the module gpu_profile hooks for the ensembles


def dynamo_graphs() -> int:
    """Graphs compiled by TorchDynamo since its last reset (0 where it was never imported): a compile-on row
    that entered ``torch.compile`` some other way than through the ``torch.compile`` attribute still shows."""
    if "torch._dynamo" not in sys.modules:
        return 0
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - a private counter: absent means unknown, not an error
        return 0


def _reason(exc: BaseException) -> str:
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _cleanup(device: torch.device) -> None:
    """Between rows: free what the last one held, and forget compiled graphs (each row compiles its own)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if "torch._dynamo" in sys.modules:  # (importing it only to reset it costs seconds)
        with contextlib.suppress(Exception):
            torch._dynamo.reset()


def row_key(method: str, precision: str, compile_: str, own: str = "") -> dict:
    """The first three columns of a variant's row (and its own overrides, ``--variants``' fourth field)."""
    key = {"method": method + (" pre-training" if method in PRETRAIN_ROWS else ""), "precision": precision,
           "compile": "on" if compile_ == "true" else "off"}
    return {**key, "overrides": own.replace("+", " ")} if own else key


def _noted(own: str, notes: str) -> str:
    """A row's notes, after its own overrides (``--variants``' fourth field) when it has any."""
    return "; ".join(x for x in (own.replace("+", " "), notes) if x)


class KernelProfile:
    """``--kernels N``: torch.profiler over one untimed step of a row (gpu_profile.profile_one starts and stops it;
    CUDA activity only on CUDA, CPU activity otherwise) and its top ``n`` kernels (operators on a CPU) by self
    device time, torch.profiler's ``key_averages``. The first ``start()`` counts; later ones are no-ops."""

    def __init__(self, device: torch.device, n: int) -> None:
        self.device, self.n = device, n
        self.prof: Any = None
        self.used = False
        self.t0 = 0.0
        self.step_s: float | None = None  # wall time of the profiled step, profiler overhead included
        self.top: list[dict] | None = None  # name, seconds in the step, calls
        self.total_s: float | None = None  # all kernels' self device time in the step
        self.error: str | None = None
        self.finished: Any = None  # the stopped profiler, until result() summarises it

    def start(self) -> None:
        if self.used:
            return
        self.used = True
        from torch.profiler import ProfilerActivity, profile

        activity = ProfilerActivity.CUDA if self.device.type == "cuda" else ProfilerActivity.CPU
        try:
            self.prof = profile(activities=[activity])
            self.prof.__enter__()
        except Exception as exc:  # noqa: BLE001 - the kernel lines then say why
            self.prof, self.error = None, _reason(exc)
        self.t0 = time.perf_counter()

    def stop(self, complete: bool = True) -> None:
        if self.prof is None:
            return
        prof, self.prof = self.prof, None
        try:
            gp._sync(self.device)
            self.step_s = time.perf_counter() - self.t0
            prof.__exit__(None, None, None)
            if complete:  # summarised in result(), after the row: the events' processing is not the row's time
                self.finished = prof
            else:
                self.error = "the profiled step did not finish (budget stop)"
        except Exception as exc:  # noqa: BLE001
            self.error = _reason(exc)

    def _summarise(self, prof: Any) -> None:
        cuda = self.device.type == "cuda"

        def self_us(e: Any) -> float:  # the attribute's name changed across torch versions
            if not cuda:
                return float(e.self_cpu_time_total)
            return float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0))

        events = [e for e in prof.key_averages() if self_us(e) > 0]
        if cuda:  # the kernels (and copies) themselves, not the CPU-side operators that launched them
            events = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")] or events
        events.sort(key=self_us, reverse=True)
        self.total_s = sum(self_us(e) for e in events) / 1e6
        self.top = [{"name": e.key, "s": self_us(e) / 1e6, "calls": int(e.count)} for e in events[:self.n]]

    def result(self, step_s: float | None) -> dict:
        """The row's ``kernels`` entry: each kernel's seconds in the profiled step and its share of ``step_s``
        (the row's timed s/step), else of the profiled step's own wall time."""
        if self.finished is not None:
            prof, self.finished = self.finished, None
            try:
                self._summarise(prof)
            except Exception as exc:  # noqa: BLE001
                self.error = _reason(exc)
        base, of = (step_s, "s/step") if step_s else (self.step_s, "the profiled step's wall time")
        out: dict[str, Any] = {"activity": "CUDA" if self.device.type == "cuda" else "CPU", "share of": of,
                               "profiled step s": self.step_s, "all kernels s": self.total_s, "error": self.error}
        if not self.used:
            out["error"] = "no step was profiled (the row stopped before it)"
        out["top"] = [{**k, "share": k["s"] / base if base else None} for k in self.top or []]
        return out


def kernel_lines(row: dict) -> list[str]:
    """The ``--kernels`` lines of one row, printed before the table."""
    k = row.get("kernels")
    if not k:
        return []
    head = f"kernels {row['method']} {row['precision']} compile={row['compile']}"
    if k.get("error") or not k.get("top"):
        return [f"{head}: none ({k.get('error') or 'no kernel recorded'})"]
    lines = [f"{head}: top {len(k['top'])} by self {k['activity']} time over one step, share of {k['share of']}"
             + (f"; all kernels {k['all kernels s']:.4g} s" if k.get("all kernels s") is not None else "")]
    for i, e in enumerate(k["top"], 1):
        name = e["name"] if len(e["name"]) <= KERNEL_NAME_CHARS else e["name"][:KERNEL_NAME_CHARS - 3] + "..."
        share = f"{100 * e['share']:5.1f} %" if e.get("share") is not None else "    ? %"
        lines.append(f"  {i:2d}. {share} {e['s']:.4g} s {e['calls']}x {name}")
    return lines


def run_variant(method: str, precision: str, compile_: str, overrides: list[str], budget_s: float,
                args: argparse.Namespace, data: Any) -> dict:
    """One row: bench/gpu_profile.py's profile_one under ``overrides`` and ``budget_s``; a failure is a row."""
    row: dict[str, Any] = {**row_key(method, precision, compile_), "budget s": budget_s}
    graphs0 = dynamo_graphs()
    # --kernels: the baseline row only (the profile's overhead is kept out of its timed steps)
    kp = (KernelProfile(torch.device(args.device), args.kernels)
          if getattr(args, "kernels", 0) and (precision, compile_) == ("fp32", "false") else None)
    try:
        with counting_compile() as calls:
            r = gp.profile_one(method, args.dataset, args.eps, args.device, args.steps, args.warmup, args.tiny,
                               args.pretrain_iters, args.data_root, budget=budget_s, overrides=overrides, data=data,
                               first_steps=args.first_steps, **({"kernels": kp} if kp is not None else {}))
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the check goes on; the row says why
        row["notes"] = f"failed: {_reason(exc)}"
        row["error"] = f"{type(exc).__name__}: {exc}"
        if kp is not None:
            row["kernels"] = kp.result(None)
        return row
    row["profile"] = r
    row["peak GB"] = r.get("peak GB")
    notes = []
    if method in PRETRAIN_ROWS:
        row["s/step"], row["TFLOP/s"] = r.get("pretrain s/iter"), r.get("pretrain TFLOP/s")
        row["full run h"] = r.get("pretrain full h")
        if r.get("pretrain pairs"):
            notes.append(f"{r.get('pretrain iters timed', 0)} warm-up iterations of {r['pretrain chunk']} pairs "
                         f"timed; full: {r['pretrain pairs']} pairs x {r['pretrain iters (full)']}")
        else:
            notes.append("no pre-training observed")
    else:
        row["s/step"], row["TFLOP/s"], row["full run h"] = r.get("s/step"), r.get("TFLOP/s"), r.get("full run h")
        timed = r.get("steps timed", 0)
        notes.append(f"{timed} steps timed" if timed or row["s/step"] is None else "s/step from warm-up steps")
    if r.get("stopped") and row["s/step"] is None:  # (a budget stop after timed steps is the normal end)
        notes.append(f"budget stop in {r['stopped']}")
    if row["s/step"] is not None and row["TFLOP/s"] is None:
        notes.append("FLOPs not counted")
    graphs = dynamo_graphs() - graphs0
    if compile_ == "true" and not calls[0] and not graphs:
        notes.append("torch.compile never called: not compiled")
    elif calls[0] or graphs:
        notes.append(f"torch.compile called {calls[0]}x, {graphs} graphs compiled")
    row["notes"] = "; ".join(notes)
    if kp is not None:
        row["kernels"] = kp.result(row["s/step"])
    return row


# ---- the table ---------------------------------------------------------------------------------------------

def _cell(row: dict, col: str) -> str:
    v = row.get(col)
    if col == "notes" and isinstance(v, str):
        v = v if len(v) <= NOTE_CHARS else v[:NOTE_CHARS - 3] + "..."
        return v.replace("|", "/").replace("\n", " ")
    return gp._fmt(v)


def caption(env: dict, args: argparse.Namespace, used_s: float) -> str:
    return (f"gpu-check: torch {env['torch']} | CUDA {env['cuda']} | cuDNN {env['cudnn']} | {env['device']} | "
            f"python {env['python']} | {args.dataset} profile={'quick (tiny)' if args.tiny else 'paper'} "
            f"eps={args.eps}{''.join(f' {o}' for o in getattr(args, 'overrides', []))} | "
            f"{used_s:.0f} s of a {args.budget:g} min budget")


def table(env: dict, args: argparse.Namespace, rows: list[dict], used_s: float) -> str:
    """The one table: a caption line, the header, the matmul row, a row per variant."""
    lines = [caption(env, args, used_s), "", "| " + " | ".join(COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(_cell(r, c) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def say(text: str) -> None:
    print(f"[gpu_check {time.perf_counter() - T_START:.0f} s] {text}", file=sys.stderr, flush=True)


# ---- main --------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=None,
                    help="minutes for the whole check, from its start (default 6; 0.75 with --tiny)")
    ap.add_argument("--device", default=None, help="default: cuda if available (cpu with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="tests/tiny.py's configs on digits: a CPU smoke test")
    ap.add_argument("--dataset", default=None, help="default: fmnist (digits with --tiny)")
    ap.add_argument("--eps", default="10")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--compile", dest="compiles", default=",".join(COMPILES), help="compile values: false,true")
    ap.add_argument("--variants", default=None,
                    help="rows as method:precision:compile[:KEY=VALUE+...], comma-separated (e.g. feta:bf16:true, "
                         "gswgan:bf16:false:ensemble.conv=batched), instead of "
                         "--methods x --precisions x --compile")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a Hydra override for every row whose method has the key (repeatable)")
    ap.add_argument("--kernels", type=int, default=0,
                    help="top N kernels by self device time of each method's fp32/compile-off row, over one untimed "
                         "step (torch.profiler), printed before the table and kept in the JSON (default 0: off)")
    ap.add_argument("--steps", type=int, default=None,
                    help="timed steps per row at most (default 10000: the row's budget share ends it; 2 with --tiny)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 2, 1 with --tiny)")
    ap.add_argument("--first-steps", type=int, default=None,
                    help="steps profiled of a first phase such as feta's warm-up (default warm-up + 3; with --tiny "
                         "warm-up + steps)")
    ap.add_argument("--pretrain-iters", type=int, default=5, help="ensemble warm-up iterations run per member")
    ap.add_argument("--matmul-n", type=int, default=None, help="matmul size (default 8192 on CUDA, 256 on a CPU)")
    ap.add_argument("--data-root", default=None, help="default: $DPGEN_DATA or data")
    ap.add_argument("--out", default=None, help="a folder: also write gpu_check.md (the table) and gpu_check.json")
    a = ap.parse_args(argv)
    a.device = a.device or ("cpu" if a.tiny or not torch.cuda.is_available() else "cuda")
    a.dataset = a.dataset or ("digits" if a.tiny else "fmnist")
    a.budget = a.budget if a.budget is not None else (0.75 if a.tiny else 6.0)
    a.steps = a.steps if a.steps is not None else (2 if a.tiny else 10000)
    a.warmup = a.warmup if a.warmup is not None else 1 if a.tiny else 2
    a.first_steps = a.first_steps if a.first_steps is not None else (None if a.tiny else a.warmup + 3)
    a.data_root = a.data_root or os.environ.get("DPGEN_DATA", "data")
    if a.budget <= 0 or a.steps < 1 or a.warmup < 1:
        ap.error("--budget must be > 0, --steps and --warmup >= 1")
    if a.variants:
        try:
            a.rows = [tuple(v.split(":", 3)) for v in a.variants.split(",")]
            assert all(len(r) in (3, 4) and r[2] in COMPILES for r in a.rows)
            assert all(all("=" in o for o in r[3].split("+")) for r in a.rows if len(r) == 4)
            a.rows = [r if len(r) == 4 else (*r, "") for r in a.rows]
        except AssertionError:
            ap.error("--variants: method:precision:compile[:KEY=VALUE+...] items, compile false or true")
        a.methods = ",".join(dict.fromkeys(m for m, *_ in a.rows))
    else:
        a.rows = [(m, p, c, "") for m in a.methods.split(",") for p in a.precisions.split(",")
                  for c in a.compiles.split(",")]
    if a.kernels < 0:
        ap.error("--kernels must be >= 0")
    unknown = [m for m in a.methods.split(",") if m not in gp.METHODS]
    if unknown:
        ap.error(f"unknown method {unknown[0]!r}; choose from {', '.join(gp.METHODS)}")
    return a


def main(argv: list[str] | None = None, t_start: float | None = None) -> list[dict]:
    """Run the check; returns the rows (the matmul row first). ``t_start``: when the budget's clock started
    (default: this module's import)."""
    a = parse_args(argv)
    deadline = (T_START if t_start is None else t_start) + 60.0 * a.budget
    device = torch.device(a.device)
    env = environment(device)
    say(f"torch {env['torch']}, CUDA {env['cuda']}, {env['device']}; budget {a.budget:g} min")
    rows: list[dict] = []
    n = a.matmul_n or (8192 if device.type == "cuda" else 256)
    try:
        rows.append(matmul_rate(device, n, seconds=0.5 if a.tiny else 3.0))
    except Exception as exc:  # noqa: BLE001
        rows.append({"method": f"bf16 matmul n={n}", "precision": "bf16", "notes": f"failed: {_reason(exc)}"})
    ref = rows[0].get("TFLOP/s")
    say(f"bf16 matmul: {gp._fmt(ref)} TFLOP/s")
    _cleanup(device)

    variants = a.rows
    plans: list[tuple[tuple[str, ...], list[str], str | None]] = []
    try:
        from dpgen.data import load_dataset

        has_compile = compile_known(a.dataset, a.eps, a.tiny)
        data = load_dataset(a.dataset, a.data_root, cache=False)  # once for every row; no cache file written
        warm_imports(a.methods.split(","))
        for v in variants:
            m, p, c, own = v
            profile, base = gp.base_config(m, a.tiny)
            extra = gp._applicable(a.overrides, gp._compose(m, a.dataset, a.eps, profile, base))
            ov = variant_overrides(p, c, has_compile) + extra + [o for o in own.split("+") if o]
            plans.append((v, ov, preflight(m, a.dataset, a.eps, a.tiny, ov)))
    except Exception as exc:  # noqa: BLE001 - no row can run (missing data, a broken config): each says why
        data, why = None, _reason(exc)
        plans = [(v, [], why) for v in variants]

    runnable = [v for v, _, why in plans if why is None]
    dropped = set(plan_rows(runnable, deadline - reserve_s(60.0 * a.budget) - time.perf_counter(), a.tiny))
    if dropped:
        say(f"{len(dropped)} rows skipped to give the others their minimum share: "
            + ", ".join(":".join(x for x in v if x) for v in runnable if v in dropped))
    weights_left = sum(row_weight(v[2], v[0]) for v in runnable if v not in dropped)
    for i, (v, ov, why) in enumerate(plans, 1):
        m, p, c, own = v
        label = f"{m} precision={p} compile={c}" + (f" {own.replace('+', ' ')}" if own else "")
        key = row_key(m, p, c, own)
        if why is not None:
            rows.append({**key, "notes": _noted(own, f"failed: {why}")})
            say(f"row {i}/{len(plans)} {label}: not run: {why}")
            continue
        if v in dropped:
            rows.append({**key, "notes": _noted(own, "skipped (budget): lower priority than the rows that ran")})
            continue
        w = row_weight(c, m)
        share = budget_share(deadline - reserve_s(60.0 * a.budget) - time.perf_counter(), w, weights_left)
        weights_left -= w
        if share < method_min_s(m, a.tiny):
            rows.append({**key, "notes": _noted(own, "skipped: budget spent")})
            say(f"row {i}/{len(plans)} {label}: skipped, budget spent")
            continue
        say(f"row {i}/{len(plans)} {label}: {share:.1f} s")
        row = run_variant(m, p, c, ov, share, a, data)
        row.update(key)
        row["notes"] = _noted(own, row.get("notes", ""))
        if ref and row.get("TFLOP/s") is not None:
            row["% matmul"] = 100.0 * row["TFLOP/s"] / ref
        rows.append(row)
        _cleanup(device)
        say(f"row {i}/{len(plans)} {label}: {gp._fmt(row.get('s/step'))} s/step, {row['notes']}")

    out = table(env, a, rows, time.perf_counter() - (T_START if t_start is None else t_start))
    kernels = [ln for r in rows for ln in kernel_lines(r)]
    if a.out:
        folder = Path(a.out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "gpu_check.md").write_text(out + "\n")
        (folder / "gpu_check.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1,
                                                          default=str) + "\n")
    sys.stderr.flush()
    if kernels:
        print("\n".join(kernels) + "\n", flush=True)
    print(out, flush=True)  # the last thing printed
    return rows


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the table stays the last thing printed: no exit-time warning (compile workers, ...) after it
