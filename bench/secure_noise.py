"""What ``privacy.secure_noise`` costs: the noise helper alone, and whole training steps of every method.

1. Helper: :func:`dpgen.privacy.randomness.gaussian_noise` for ``--sizes`` floats, plain (one normal draw per
   coordinate) against secure (the sum of four), median of ``--repeats`` calls.
2. Steps: each method's training loop (``--profile``, default quick, on ``--dataset``) for ``--warmup`` +
   ``--steps`` steps with secure_noise off and on, the two settings alternating ``--rounds`` times in one
   process (side by side, as the brief asks of speed figures); seconds per step after the warm-up (median over
   rounds) and the ratio on/off. Ensembles pre-train for ``--pretrain-iters`` iterations only (no noise there).

    python bench/secure_noise.py                                   # CPU, quick profiles on the embedded digits
    python bench/secure_noise.py --device cuda --profile paper --dataset fmnist --methods dpgan,feta

Prints a Markdown table (and writes it to ``--out``).
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from gpu_profile import ENSEMBLES, METHODS, _compose, _sync  # noqa: E402


class _Enough(Exception):
    pass


def helper_row(size: int, device: torch.device, repeats: int) -> dict:
    from dpgen.privacy.randomness import gaussian_noise, secret_generator

    times = {}
    for secure in (False, True):
        g = secret_generator(device, seed=0, secure_noise=secure)
        gaussian_noise((size,), 1.0, g)  # warm-up
        ts = []
        for _ in range(repeats):
            _sync(device)
            t = time.perf_counter()
            gaussian_noise((size,), 1.0, g)
            _sync(device)
            ts.append(time.perf_counter() - t)
        times[secure] = statistics.median(ts)
    return {"what": f"gaussian_noise, {size:,} floats", "off": times[False] * 1e3, "on": times[True] * 1e3,
            "unit": "ms", "ratio": times[True] / times[False]}


def step_seconds(method: str, secure: bool, args, data) -> float:
    """Mean seconds per training step after the warm-up, with ``privacy.secure_noise=secure``."""
    from dpgen.core.methods import load_method
    from dpgen.core.pipeline import seed_everything
    from dpgen.core.run import Run
    from dpgen.privacy import PrivacyLedger, parse_epsilon

    overrides = [f"privacy.secure_noise={str(secure).lower()}"]
    cfg = _compose(method, args.dataset, args.eps, args.profile, overrides)
    if method in ENSEMBLES:
        cfg = _compose(method, args.dataset, args.eps, args.profile,
                       overrides + [f"{cfg.method.hparams}.pretrain_iters={args.pretrain_iters}"])
    ledger = PrivacyLedger(delta=float(cfg.delta), target_epsilon=parse_epsilon(cfg.eps),
                           accountant=cfg.privacy.accountant, accounting=cfg.privacy.accounting)
    dev = torch.device(args.device)
    stamps: list[float] = []
    n = args.warmup + args.steps

    class TimedRun(Run):
        def step_done(self, step, scalars, state_fn) -> None:
            _sync(dev)
            stamps.append(time.perf_counter())
            if len(stamps) > n:
                raise _Enough

    with tempfile.TemporaryDirectory() as tmp:
        run = TimedRun(tmp, ledger, dev, 0, {}, checkpoint_every=10**9, log_every=10**9, progress=False,
                       tensorboard=False, secure_noise=bool(cfg.privacy.secure_noise))
        seed_everything(0)
        try:
            load_method(cfg.method.module).train(cfg[cfg.method.hparams], data, ledger, run)
        except _Enough:
            pass
        finally:
            run.close()
    if len(stamps) <= args.warmup + 1:
        raise SystemExit(f"{method}: only {len(stamps)} steps ran; lower --warmup")
    lo = args.warmup
    return (stamps[-1] - stamps[lo]) / (len(stamps) - 1 - lo)


def table(rows: list[dict]) -> str:
    cols = ("what", "off", "on", "unit", "ratio")
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--profile", default="quick", choices=("quick", "paper"))
    ap.add_argument("--eps", default="10")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pretrain-iters", type=int, default=1)
    ap.add_argument("--sizes", default="100000,1000000,10000000")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--data-root", default=os.environ.get("DPGEN_DATA", "data"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from dpgen.core.pipeline import quiet_known_noise
    from dpgen.data import load_dataset

    quiet_known_noise()
    logging.getLogger("dpgen").setLevel(logging.WARNING)
    dev = torch.device(args.device)
    rows = [helper_row(int(s), dev, args.repeats) for s in args.sizes.split(",") if s]
    for r in rows:
        print(table([r]).splitlines()[-1], file=sys.stderr, flush=True)
    data = load_dataset(args.dataset, args.data_root)
    for method in args.methods.split(","):
        if method not in METHODS:
            raise SystemExit(f"error: unknown method {method!r}; choose from {', '.join(METHODS)}")
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for secure in (False, True):
                times[secure].append(step_seconds(method, secure, args, data))
        off, on = statistics.median(times[False]), statistics.median(times[True])
        rows.append({"what": f"{method} step ({args.profile}, {args.dataset})", "off": off, "on": on, "unit": "s",
                     "ratio": on / off})
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    out = table(rows)
    print(out)
    if args.out:
        Path(args.out).write_text(out + "\n")
    return rows


if __name__ == "__main__":
    main()
