"""Time dpgen.privacy.calibrate_noise_multiplier for a long sampled-Gaussian composition, RDP against PLD.

The composition is one ledger entry: ``steps`` Poisson-sampled Gaussian releases at rate q (default:
20000 steps at q = 256/60000, a DP-SGD run on MNIST-sized data). Each accountant calibrates σ to the
target ε in this process; the script prints seconds, σ, the ε that σ gives, and the PLD/RDP time ratio.

    OMP_NUM_THREADS=1 python bench/accountant.py [--steps 20000] [--q 0.004267] [--eps 1,10] [--accountants rdp,pld]
"""
from __future__ import annotations

import argparse
import logging
import time

from dpgen.privacy import LedgerEntry, calibrate_noise_multiplier, compute_epsilon


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--q", type=float, default=256 / 60000)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--eps", default="1,10")
    ap.add_argument("--accountants", default="rdp,pld")
    a = ap.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp-accounting's "order excluded" messages

    def entries(z: float) -> list[LedgerEntry]:
        return [LedgerEntry("bench", [z], "poisson", a.q, count=a.steps)]

    print(f"{a.steps} Poisson-sampled Gaussian steps, q={a.q:.6g}, delta={a.delta:g}")
    print(f"{'eps':>6} {'accountant':>10} {'seconds':>9} {'sigma':>9} {'eps(sigma)':>11}")
    for eps in (float(e) for e in a.eps.split(",")):
        secs = {}
        for acct in a.accountants.split(","):
            t0 = time.perf_counter()
            z = calibrate_noise_multiplier(eps, a.delta, entries, accountant=acct)
            secs[acct] = time.perf_counter() - t0
            got = compute_epsilon(entries(z), a.delta, accountant=acct)
            print(f"{eps:>6g} {acct:>10} {secs[acct]:>9.2f} {z:>9.4f} {got:>11.4f}")
        if "rdp" in secs and "pld" in secs:
            print(f"{eps:>6g} {'pld/rdp':>10} {secs['pld'] / secs['rdp']:>9.1f}x")


if __name__ == "__main__":
    main()
