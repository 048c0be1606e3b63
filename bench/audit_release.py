"""Time one GS-WGAN-family sanitiser release with an audit's canaries against the same release without an audit.

The family's quick audit sizes by default: K = 200 partitions, M = 20 sampled members, B = 16 generated images of
28x28, efsgd's error-feedback sanitiser (C1 = C2 = 0.5, so b = 16B = 256 canary rows per canary) and its default
800 canaries; ``--sanitizer gswgan`` times GS-WGAN's (b = 4B, 3,200 canaries). Both variants run in this process
on the same rows, interleaved rep by rep, so a loaded machine slows them alike: the ratio is what to read.

    OMP_NUM_THREADS=1 python bench/audit_release.py [--sanitizer efsgd|gswgan] [--reps 15]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from dpgen.audit.canaries import Canaries
from dpgen.audit.hooks import SanitizerCanaries, max_sanitizer_canaries, sanitizer_rows_per_canary
from dpgen.audit.hooks import DEFAULT_ROW_BUDGET
from dpgen.efsgd.sanitizer import ErrorFeedbackSanitizer
from dpgen.gswgan.sanitizer import Sanitizer
from dpgen.privacy.randomness import secret_generator

K, M, B, CLASSES = 200, 20, 16, 10


def sanitizer(kind: str):
    gen = secret_generator("cpu", seed=1)
    if kind == "efsgd":
        return ErrorFeedbackSanitizer(0.5, 4.0, 0.5, True, 1.0, gen, parts=K, classes=CLASSES)
    return Sanitizer(0.5, 4.0, gen)


def release(san, kind: str, g: torch.Tensor, k: torch.Tensor, y: torch.Tensor) -> None:
    if kind == "efsgd":
        san.sanitize_sum(g, k, y, 1.0)
    else:
        san.sanitize_sum(g, 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sanitizer", choices=["efsgd", "gswgan"], default="efsgd")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    torch.manual_seed(0)
    plain, audited = sanitizer(args.sanitizer), sanitizer(args.sanitizer)
    row_sens = float(getattr(audited, "sensitivity", 2.0 * audited.clip))
    per = sanitizer_rows_per_canary(row_sens, audited.clip, B)
    m = max_sanitizer_canaries(K, B, per, DEFAULT_ROW_BUDGET)
    canaries = Canaries(m, lambda name: secret_generator("cpu", seed=3), "cpu")
    group = SanitizerCanaries.attach(canaries, K, B, M / K, {"sanitizer": audited})
    g = torch.randn(M, B, 1, 28, 28)
    times: dict[str, list[float]] = {"no audit": [], "audit": []}
    for _ in range(args.reps):
        k, y = torch.randperm(K)[:M], torch.randint(0, CLASSES, (B,))
        group.start_iteration(k)
        for name, san in (("no audit", plain), ("audit", audited)):
            t = time.perf_counter()
            release(san, args.sanitizer, g, k, y)
            times[name].append(time.perf_counter() - t)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"| sanitiser | canaries | rows per canary | no audit ms | audit ms | audit / no audit |")
    print("|---|---|---|---|---|---|")
    print(f"| {args.sanitizer} | {m} | {per} | {1e3 * med['no audit']:.1f} | {1e3 * med['audit']:.1f} | "
          f"{med['audit'] / med['no audit']:.2f} |")


if __name__ == "__main__":
    main()
