"""Time feta's DP-SGD micro-batch step (dpgen.feta.dpsgd.MicroStep, the code training runs) across its GPU switches,
and extrapolate each setting to a paper DP-SGD step and to the whole stage.

Settings (every combination of the lists given): ``--micro`` records per micro-batch (``auto``: what
``feta.micro_batch=null`` picks on this device, dpgen.privacy.micro_batch), ``--conv`` the ghost backend's
per-record convolution gradients (``feta.ghost_conv``: auto, patches, grouped), ``--graph`` off/on
(``feta.cuda_graph``), ``--precisions`` (``precision=fp32|tf32|bf16``), ``--backends`` ghost / torch_func. The network
is the paper profile's UNet on 28 px (nf 32, ch_mult 2,2, two residual blocks, attention at 14; ``--unet quick`` the
quick one), K = ``--multiplicity`` draws per record (paper 32), random inputs of F-MNIST's shape: the step's time
does not depend on the pixels, and no data file is needed.

Each setting runs ``--warmup`` untimed micro-batches (with a graph: the warm-up call and the capture), then
``--reps`` timed ones; the device is synchronised once before and once after the timed ones. A DP-SGD step of
expected batch B (``--batch``, paper 4,096) takes ceil(B/m) micro-batches, the stage ``--iters`` (paper 2,200) steps.
The settings run one after another (a captured graph keeps its memory until it is freed), the first setting again
at the end: its two rows show the drift of the machine within the call. The table is printed last.

    python bench/feta_step.py --device cuda                                 # the default grid, about 2 min on an H200
    python bench/feta_step.py --device cuda --micro 32,auto --conv auto,patches --graph off,on --precisions fp32,bf16
    python bench/feta_step.py --device cpu --unet quick --multiplicity 2 --micro 4 --batch 16 --reps 2   # a smoke test
    python bench/feta_step.py --best out/feta_step.json     # the fastest fp32 setting as gpu_check's --set options
"""
from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import sys
import time
from pathlib import Path

import torch

from dpgen.core.precision import training_precision
from dpgen.feta.dpsgd import MicroStep, clipped_grad_sum_func, micro_batch_for
from dpgen.nets.edm import EDMDenoiser
from dpgen.nets.unet import UNet
from dpgen.privacy.randomness import secret_generator

CLASSES = 10
UNETS = {"paper": dict(nf=32, ch_mult=(2, 2), num_res_blocks=2, attn_res=(14,)),  # configs/method/feta.yaml, paper
         "quick": dict(nf=8, ch_mult=(1, 2), num_res_blocks=1, attn_res=(7,))}


def build(unet: str, device: torch.device) -> EDMDenoiser:
    torch.manual_seed(0)
    return EDMDenoiser(UNet(1, 28, CLASSES, **UNETS[unet])).to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_setting(net: EDMDenoiser, device: torch.device, micro: int, k: int, conv: str, graph: bool,
                 backend: str, warmup: int, reps: int) -> dict:
    """Seconds per micro-batch of ``micro`` records (median and range over ``reps``), and the peak memory."""
    step = MicroStep(net, 1.0, grad_backend=backend, graph=graph, ghost_conv=conv)
    gen = secret_generator(device, seed=0)
    x = torch.rand(micro, 1, 28, 28, device=device, generator=None) * 2 - 1
    y = torch.randint(0, CLASSES, (micro,), device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(warmup):
        clipped_grad_sum_func(net, x, y, k, 1.0, micro, gen, step=step)
    _sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sums, _ = clipped_grad_sum_func(net, x, y, k, 1.0, micro, gen, step=step)
        _sync(device)  # per rep, so the spread is per micro-batch (one sync after the work: not inside it)
        times.append(time.perf_counter() - t0)
    row = {"s/micro": sorted(times)[len(times) // 2], "min": min(times), "max": max(times),
           "finite": bool(all(torch.isfinite(s).all() for s in sums))}
    if device.type == "cuda":
        row["peak GB"] = torch.cuda.max_memory_allocated(device) / 1e9
    fn = step.fn
    if graph:
        row["graph"] = "replayed" if getattr(fn, "captured", False) else \
            ("eager: " + fn.failed if getattr(fn, "failed", None) else "eager (CUDA only)")
    return row


def best_overrides(rows: list[dict], precision: str = "fp32") -> list[str]:
    """The Hydra overrides of the fastest timed setting in ``precision`` (``--best``: what bench/gpu_levers.sh times
    as a whole step next); none when no such row was timed."""
    timed = [r for r in rows if r.get("s/step") and r.get("precision") == precision and r.get("backend") == "ghost"]
    if not timed:
        return []
    r = min(timed, key=lambda r: r["s/step"])
    return [f"feta.micro_batch={r['micro']}", f"feta.ghost_conv={r['conv']}",
            f"feta.cuda_graph={'true' if r['graph'] == 'on' else 'false'}"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--best", default=None, metavar="JSON",
                    help="print the fastest fp32 ghost setting of an earlier run's feta_step.json as gpu_check's "
                         "--set options (nothing if none was timed or the file is unreadable), and exit")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--unet", default="paper", choices=tuple(UNETS))
    ap.add_argument("--multiplicity", type=int, default=32, help="K draws per record (paper 32)")
    ap.add_argument("--batch", type=int, default=4096, help="expected Poisson batch B (paper 4,096)")
    ap.add_argument("--iters", type=int, default=2200, help="DP-SGD steps of the stage (paper 2,200)")
    ap.add_argument("--micro", default="32,64,128,auto", help="records per micro-batch; auto: feta.micro_batch=null")
    ap.add_argument("--conv", default="auto,patches,grouped", help="feta.ghost_conv values (ghost backend)")
    ap.add_argument("--graph", default="off,on", help="feta.cuda_graph values: off,on")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--backends", default="ghost", help="ghost,torch_func")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget", type=float, default=300.0,
                    help="seconds: settings not started by then are skipped (not the first setting's second run)")
    ap.add_argument("--out", default=None, help="a folder: also write feta_step.md and feta_step.json")
    a = ap.parse_args(argv)
    if a.reps < 1 or a.warmup < 2:
        ap.error("--reps >= 1 and --warmup >= 2 (a graph's warm-up call and its capture)")
    return a


def resolve_micro(micro: str, net: EDMDenoiser, device: torch.device, k: int, batch: int, backend: str,
                  conv: str) -> int:
    """``micro`` as a number; ``auto``: what ``feta.micro_batch=null`` picks here for this backend and conv path
    (on CUDA measured with an eager step under the precision in effect, dpgen.feta.dpsgd.micro_batch_for)."""
    if micro != "auto":
        return int(micro)
    probe = MicroStep(net, 1.0, grad_backend=backend, ghost_conv=conv)
    return micro_batch_for(net, None, k, [1, 28, 28], batch, device, step=probe)


def settings(a: argparse.Namespace) -> list[dict]:
    out = []
    for backend, prec, micro, conv, graph in itertools.product(a.backends.split(","), a.precisions.split(","),
                                                                dict.fromkeys(a.micro.split(",")), a.conv.split(","),
                                                                a.graph.split(",")):
        if backend != "ghost" and conv != a.conv.split(",")[0]:
            continue  # ghost_conv is the ghost backend's
        out.append({"backend": backend, "precision": prec, "micro": micro, "conv": conv if backend == "ghost" else "-",
                    "graph": graph})
    return out + ([dict(out[0], again=True)] if len(out) > 1 else [])  # (dicts: "auto" is resolved in place)


COLUMNS = ("backend", "precision", "micro", "conv", "graph", "s/micro", "min", "max", "s/step", "stage h",
           "peak GB", "notes")


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return "" if v is None else str(v)


def main(argv: list[str] | None = None) -> list[dict]:
    a = parse_args(argv)
    if a.best:
        try:
            rows = json.loads(Path(a.best).read_text())
        except (OSError, ValueError):
            rows = []
        print(" ".join(f"--set {o}" for o in best_overrides(rows)))
        return rows
    device = torch.device(a.device)
    t0 = time.perf_counter()
    net = build(a.unet, device)
    rows = []
    for s in settings(a):
        label = " ".join(f"{k}={s[k]}" for k in ("backend", "precision", "micro", "conv", "graph"))
        if time.perf_counter() - t0 > a.budget and not s.get("again"):  # the drift row always runs
            rows.append({**s, "notes": "skipped (budget)"})
            continue
        print(f"[feta_step {time.perf_counter() - t0:.0f} s] {label}", file=sys.stderr, flush=True)
        conv = s["conv"] if s["conv"] != "-" else "auto"
        try:
            with training_precision(s["precision"], device):
                auto = s["micro"] == "auto"
                s["micro"] = resolve_micro(s["micro"], net, device, a.multiplicity, a.batch, s["backend"], conv)
                r = time_setting(net, device, s["micro"], a.multiplicity, conv, s["graph"] == "on", s["backend"],
                                 a.warmup, a.reps)
                if auto:
                    r["notes"] = f"auto: {s['micro']} records"
        except Exception as exc:  # noqa: BLE001 - a setting that fails (out of memory) is a row saying why
            r = {"notes": f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
        micros = math.ceil(a.batch / s["micro"]) if isinstance(s["micro"], int) else None
        if r.get("s/micro") is not None:
            r["s/step"] = r["s/micro"] * micros
            r["stage h"] = r["s/step"] * a.iters / 3600
        notes = [r.pop("notes", "")] + ([r.pop("graph")] if "graph" in r else []) + \
            (["first setting again"] if s.get("again") else []) + ([] if r.get("finite", True) else ["NON-FINITE"])
        rows.append({**s, **r, "notes": "; ".join(n for n in notes if n)})
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    head = (f"feta DP-SGD micro-batch step, {a.unet} UNet, K={a.multiplicity}, {device}"
            + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
            + f", torch {torch.__version__}; s/step = s/micro x ceil({a.batch}/micro), stage = {a.iters} steps; "
              f"{a.reps} timed micro-batches per row (median, min, max), {time.perf_counter() - t0:.0f} s in all")
    table = "\n".join([head, "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
                      + ["| " + " | ".join(_cell(r.get(c)) for c in COLUMNS) + " |" for r in rows])
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "feta_step.md").write_text(table + "\n")
        (Path(a.out) / "feta_step.json").write_text(json.dumps(rows, indent=1, default=str) + "\n")
    print(table, flush=True)
    return rows


if __name__ == "__main__":
    main()
