"""One GPU check: the card's bf16 matmul rate, then four methods at profile=paper under every precision/compile.

Prints ONE table last (stdout; progress goes to stderr before it): a caption with the torch, CUDA, cuDNN and
GPU names, a first row with the measured bf16 matmul rate of the card (``torch.matmul`` of two n x n bf16
matrices, the reference for the "% matmul" column), then one row per (method, variant):

- methods: feta, gswgan's discriminator pre-training (its dominant cost: K discriminators x 2000 warm-up
  iterations), dpgan and gpate, each on its ``profile=paper`` config (fmnist by default);
- variants: ``precision=fp32|tf32|bf16`` x ``compile=false|true`` (config overrides, dpgen/core/precision.py),
  all in this one process, the fp32/compile-off baseline first;
- columns: s/step (gswgan: s per warm-up iteration of one chunk of pairs; the mean over the steps the row's
  budget share allowed after the warm-up steps), achieved TFLOP/s (FLOPs counted
  by ``torch.utils.flop_counter`` over one untimed step / s/step), that rate as a percentage of the measured
  bf16 matmul rate, peak memory (``torch.cuda.max_memory_allocated``; on a CPU the process's max RSS, which
  only grows), and the full-run estimate (gswgan: the full pre-training).

Each row is bench/gpu_profile.py's :func:`profile_one` (the same timing, FLOP counting and extrapolation),
stopped by its budget share. A variant the config refuses (a precision the method does not support, a
``compile`` key the schema lacks) or that fails while training gives a row saying why, and the check goes on.

``--budget M`` (minutes, from the start of this script) is divided among the rows that can run, weighted
(compile-on rows weigh double: compilation happens inside them); a row's unspent share passes on to the rest,
and a row left with less than a few seconds says "skipped". A few seconds stay in reserve for the table.

    python bench/gpu_check.py [--budget 7] [--out DIR]        # CUDA, fmnist profile=paper (docs/performance.md)
    python bench/gpu_check.py --device cpu --tiny              # CPU smoke test: tests/tiny.py's configs on digits
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
NOTE_CHARS = 160  # a failure's reason is cut here in the table (the JSON file keeps it whole)


# ---- the budget --------------------------------------------------------------------------------------------

def row_weight(compile_: str) -> float:
    """A row's weight in the budget split: compile-on rows pay for compilation inside their share."""
    return COMPILE_WEIGHT if compile_ == "true" else 1.0


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


def row_key(method: str, precision: str, compile_: str) -> dict:
    """The first three columns of a variant's row."""
    return {"method": method + (" pre-training" if method in PRETRAIN_ROWS else ""), "precision": precision,
            "compile": "on" if compile_ == "true" else "off"}


def run_variant(method: str, precision: str, compile_: str, overrides: list[str], budget_s: float,
                args: argparse.Namespace, data: Any) -> dict:
    """One row: bench/gpu_profile.py's profile_one under ``overrides`` and ``budget_s``; a failure is a row."""
    row: dict[str, Any] = {**row_key(method, precision, compile_), "budget s": budget_s}
    graphs0 = dynamo_graphs()
    try:
        with counting_compile() as calls:
            r = gp.profile_one(method, args.dataset, args.eps, args.device, args.steps, args.warmup, args.tiny,
                               args.pretrain_iters, args.data_root, budget=budget_s, overrides=overrides, data=data,
                               first_steps=args.first_steps)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the check goes on; the row says why
        row["notes"] = f"failed: {_reason(exc)}"
        row["error"] = f"{type(exc).__name__}: {exc}"
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
            f"eps={args.eps} | {used_s:.0f} s of a {args.budget:g} min budget")


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
                    help="minutes for the whole check, from its start (default 7; 0.75 with --tiny)")
    ap.add_argument("--device", default=None, help="default: cuda if available (cpu with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="tests/tiny.py's configs on digits: a CPU smoke test")
    ap.add_argument("--dataset", default=None, help="default: fmnist (digits with --tiny)")
    ap.add_argument("--eps", default="10")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--compile", dest="compiles", default=",".join(COMPILES), help="compile values: false,true")
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
    a.budget = a.budget if a.budget is not None else (0.75 if a.tiny else 7.0)
    a.steps = a.steps if a.steps is not None else (2 if a.tiny else 10000)
    a.warmup = a.warmup if a.warmup is not None else 1 if a.tiny else 2
    a.first_steps = a.first_steps if a.first_steps is not None else (None if a.tiny else a.warmup + 3)
    a.data_root = a.data_root or os.environ.get("DPGEN_DATA", "data")
    if a.budget <= 0 or a.steps < 1 or a.warmup < 1:
        ap.error("--budget must be > 0, --steps and --warmup >= 1")
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

    variants = [(m, p, c) for m in a.methods.split(",") for p in a.precisions.split(",")
                for c in a.compiles.split(",")]
    plans: list[tuple[str, str, str, list[str], str | None]] = []
    try:
        from dpgen.data import load_dataset

        has_compile = compile_known(a.dataset, a.eps, a.tiny)
        data = load_dataset(a.dataset, a.data_root, cache=False)  # once for every row; no cache file written
        warm_imports(a.methods.split(","))
        for m, p, c in variants:
            ov = variant_overrides(p, c, has_compile)
            plans.append((m, p, c, ov, preflight(m, a.dataset, a.eps, a.tiny, ov)))
    except Exception as exc:  # noqa: BLE001 - no row can run (missing data, a broken config): each says why
        data, why = None, _reason(exc)
        plans = [(m, p, c, [], why) for m, p, c in variants]

    weights_left = sum(row_weight(c) for _, _, c, _, why in plans if why is None)
    for i, (m, p, c, ov, why) in enumerate(plans, 1):
        label = f"{m} precision={p} compile={c}"
        if why is not None:
            rows.append({**row_key(m, p, c), "notes": f"failed: {why}"})
            say(f"row {i}/{len(plans)} {label}: not run: {why}")
            continue
        w = row_weight(c)
        share = budget_share(deadline - reserve_s(60.0 * a.budget) - time.perf_counter(), w, weights_left)
        weights_left -= w
        if share < min_row_s(a.tiny):
            rows.append({**row_key(m, p, c), "notes": "skipped: budget spent"})
            say(f"row {i}/{len(plans)} {label}: skipped, budget spent")
            continue
        say(f"row {i}/{len(plans)} {label}: {share:.1f} s")
        row = run_variant(m, p, c, ov, share, a, data)
        if ref and row.get("TFLOP/s") is not None:
            row["% matmul"] = 100.0 * row["TFLOP/s"] / ref
        rows.append(row)
        _cleanup(device)
        say(f"row {i}/{len(plans)} {label}: {gp._fmt(row.get('s/step'))} s/step, {row['notes']}")

    out = table(env, a, rows, time.perf_counter() - (T_START if t_start is None else t_start))
    if a.out:
        folder = Path(a.out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "gpu_check.md").write_text(out + "\n")
        (folder / "gpu_check.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1,
                                                          default=str) + "\n")
    sys.stderr.flush()
    print(out, flush=True)  # the last thing printed
    return rows


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the table stays the last thing printed: no exit-time warning (compile workers, ...) after it
