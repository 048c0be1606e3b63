"""Each method's ``profile=quick`` training step on a CPU with ``compile=false`` and ``compile=true``, side by side.

The quick profiles are what users without a GPU run, so a faster CPU step is a win of its own. For every method
(all eight by default) this runs, in ONE process, bench/gpu_profile.py's :func:`profile_one` twice on the method's
``profile=quick`` config (digits by default, the embedded dataset): once with ``compile=false``, once with
``compile=true``. Each run trains ``--warmup`` untimed steps and then ``--steps`` timed ones (the steps
``Run.step_done`` counts), with the same timing as the GPU profile; the ensembles' discriminator pre-training
runs ``--pretrain-iters`` warm-up iterations (default none: it does not change the cost of a step, and
bench/gpu_check.py times it).

Printed last, a Markdown table: per method the mean s/step off and on, their ratio (on / off: below 1 means the
compiled step is faster), the time from the start of training to the first timed step off and on, and the
difference of the two, which is mostly the compilation (``torch.compile`` builds its graphs in the first steps
after the FLOP-counted step 1; a bucket size first met in a timed step compiles there and inflates the mean, so
the ratio of the median step times is given too, and the notes give the graphs compiled).

``--budget M`` (minutes, default 9.5) is shared among the runs like bench/gpu_check.py's rows (a compile-on run
weighs :data:`COMPILE_WEIGHT` times an eager one, a slow method's :data:`METHOD_WEIGHT` times a fast one's; time
a run leaves is passed on); a run out of its share reports what it measured by then and a
run that fails says why in the notes, and the bench goes on.

    python bench/quick_step.py [--methods dpgan,feta] [--steps 3] [--threads 1] [--dataset fmnist] [--out FILE]
    python bench/quick_step.py --tiny --methods dpgan --steps 1 --warmup 1   # smoke test: tests/tiny.py's configs
"""
from __future__ import annotations

import time

T_START = time.perf_counter()  # the budget counts from here

import argparse  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check as gc  # noqa: E402  (the budget split, the compile counters, the cleanup between runs)
import gpu_profile as gp  # noqa: E402  (the per-method timing)

COLUMNS = ("method", "s/step off", "s/step on", "on/off", "on/off (median)", "untimed s off", "untimed s on",
           "compile s (≈)", "notes")
COMPILE_WEIGHT = 3.0  # a compile-on run's share relative to an eager one: compilation (tens of s) happens inside
# the methods whose quick step takes seconds on a CPU (the ensembles' 200 discriminators, feta/dpdm's UNet, which
# also compiles longest) get twice the share of dpgan, gpate and dpaf
METHOD_WEIGHT = {"gswgan": 2.0, "dpac": 2.0, "efsgd": 2.0, "feta": 2.0, "dpdm": 2.0}


def run_one(method: str, compile_: str, budget_s: float, a: argparse.Namespace, data: Any) -> dict:
    """One (method, compile) run of profile_one on the quick profile; a failure is a dict with ``error``."""
    graphs0 = gc.dynamo_graphs()
    try:
        with gc.counting_compile() as calls:
            r = gp.profile_one(method, a.dataset, a.eps, "cpu", a.steps, a.warmup, a.tiny, a.pretrain_iters,
                               a.data_root, budget=budget_s, overrides=[f"compile={compile_}"], data=data,
                               first_steps=a.warmup + 1, profile="quick")
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the bench goes on; the row says why
        return {"error": gc._reason(exc)}
    r["graphs"] = gc.dynamo_graphs() - graphs0
    r["compile calls"] = calls[0]
    return r


def merge(method: str, off: dict, on: dict) -> dict:
    """One table row from the compile-off and compile-on runs of ``method``."""
    row: dict[str, Any] = {"method": method, "off": off, "on": on}
    notes = []
    for tag, r in (("off", off), ("on", on)):
        if "error" in r:
            notes.append(f"{tag}: failed: {r['error']}")
            continue
        row[f"s/step {tag}"], row[f"untimed s {tag}"] = r.get("s/step"), r.get("untimed s")
        if r.get("s/step") is None:
            notes.append(f"{tag}: no step timed" + (f" (budget stop in {r['stopped']})" if r.get("stopped") else ""))
        elif r.get("stopped"):
            notes.append(f"{tag}: {r.get('steps timed', 0)} steps timed (budget)")
    if row.get("s/step off") and row.get("s/step on") is not None:
        row["on/off"] = row["s/step on"] / row["s/step off"]
    med = {tag: statistics.median(r["step times"]) for tag, r in (("off", off), ("on", on)) if r.get("step times")}
    if med.get("off") and "on" in med:  # robust to a bucket size first compiled inside a timed step
        row["on/off (median)"] = med["on"] / med["off"]
    if row.get("untimed s off") is not None and row.get("untimed s on") is not None:
        row["compile s (≈)"] = row["untimed s on"] - row["untimed s off"]
    if "error" not in on:
        if not on.get("compile calls") and not on.get("graphs"):
            notes.append("on: torch.compile never called")
        else:
            notes.append(f"on: {on.get('graphs', 0)} graphs")
    row["notes"] = "; ".join(notes)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(gp._fmt(r.get(c)).replace("|", "/") for c in COLUMNS) + " |")
    return "\n".join(lines)


def caption(a: argparse.Namespace, used_s: float) -> str:
    return (f"quick-step: torch {torch.__version__} | cpu, {torch.get_num_threads()} threads | {a.dataset} "
            f"profile=quick{' (tiny)' if a.tiny else ''} eps={a.eps} | {a.warmup} warm-up + {a.steps} timed steps | {used_s:.0f} s")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default=",".join(gp.METHODS))
    ap.add_argument("--dataset", default="digits", help="digits (embedded) or fmnist")
    ap.add_argument("--eps", default="10")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run (default 3)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps per run (default 2)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--pretrain-iters", type=int, default=0,
                    help="ensemble pre-training warm-up iterations run (default 0: it is not the step)")
    ap.add_argument("--budget", type=float, default=9.5, help="minutes for all runs (default 9.5)")
    ap.add_argument("--tiny", action="store_true", help="tests/tiny.py's configs (a smoke test of the bench)")
    ap.add_argument("--data-root", default=None, help="default: $DPGEN_DATA or data")
    ap.add_argument("--out", default=None, help="also write the table here")
    a = ap.parse_args(argv)
    a.data_root = a.data_root or os.environ.get("DPGEN_DATA", "data")
    if a.steps < 1 or a.warmup < 1 or a.threads < 1 or a.budget <= 0:
        ap.error("--steps, --warmup and --threads must be >= 1, --budget > 0")
    unknown = [m for m in a.methods.split(",") if m not in gp.METHODS]
    if unknown:
        ap.error(f"unknown method {unknown[0]!r}; choose from {', '.join(gp.METHODS)}")
    return a


def main(argv: list[str] | None = None, t_start: float | None = None) -> list[dict]:
    """Run the bench; returns one row per method (both runs' profile rows under ``off`` and ``on``)."""
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    t0 = T_START if t_start is None else t_start
    deadline = t0 + 60.0 * a.budget
    methods = a.methods.split(",")
    try:
        from dpgen.data import load_dataset

        data = load_dataset(a.dataset, a.data_root, cache=False)
        gc.warm_imports(methods)
    except Exception as exc:  # noqa: BLE001 - every run then fails with this reason
        data, why = None, gc._reason(exc)
    else:
        why = None
    runs = [(m, c) for m in methods for c in ("false", "true")]
    def weight(m: str, c: str) -> float:
        return (COMPILE_WEIGHT if c == "true" else 1.0) * METHOD_WEIGHT.get(m, 1.0)

    weights_left = sum(weight(m, c) for m, c in runs)
    done: dict[tuple[str, str], dict] = {}
    for i, (m, c) in enumerate(runs, 1):
        w = weight(m, c)
        share = gc.budget_share(deadline - 3.0 - time.perf_counter(), w, weights_left)
        weights_left -= w
        if why is not None:
            done[m, c] = {"error": why}
        elif share < 2.0:
            done[m, c] = {"error": "skipped (budget spent)"}
        else:
            print(f"[quick_step] run {i}/{len(runs)} {m} compile={c}: {share:.0f} s", file=sys.stderr, flush=True)
            done[m, c] = run_one(m, c, share, a, data)
            gc._cleanup(torch.device("cpu"))
    rows = [merge(m, done[m, "false"], done[m, "true"]) for m in methods]
    out = caption(a, time.perf_counter() - t0) + "\n\n" + table(rows)
    if a.out:
        Path(a.out).write_text(out + "\n")
    sys.stderr.flush()
    print(out, flush=True)
    return rows


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no exit-time warning of compile workers after the table
