"""How far a freshly initialised auxiliary classifier C gets in a few steps, per ``classifier.loss`` and rate.

``python -m dpgen.dpac.classifier_probe --dataset fmnist --data-root DIR [--steps 6 20] [--lrs 4e-4 2e-3 1e-2]
[--batches 64]`` trains C (:func:`dpgen.dpac.classifier.train_classifier`, the quick profile's width, batches of
``--batches`` real training images) from ``--starts`` public initialisations and prints its test accuracy (argmax
of the logits, first 1,000 test images) per score, rate, batch and step count. DPAC re-initialises C at every generator iteration and gives it n_f +
n_r steps, so this is the classifier whose gradient reaches G, on real data at its best. A research probe on the
training split: it releases nothing and belongs to no run.
"""
from __future__ import annotations

import argparse
import os
import sys
from functools import partial

import torch

from dpgen.dpac.classifier import LOSSES, train_classifier
from dpgen.ensemble import NetStack
from dpgen.gswgan.nets import clf_init, clf_logits
from dpgen.nets.spectral import sn_init


def probe(x: torch.Tensor, y: torch.Tensor, xt: torch.Tensor, yt: torch.Tensor, loss: str, lr: float, steps: int,
          seed: int, width: int = 8, batch: int = 64, lam: float = 10.0, drift: float = 1e-3) -> float:
    """Test accuracy of one C trained for ``steps`` Adam steps on ``loss`` at rate ``lr`` from start ``seed``."""
    g = torch.Generator().manual_seed(seed)
    ncls = int(max(int(y.max()), int(yt.max()))) + 1
    clf = NetStack(partial(clf_init, ncls, list(x.shape[1:]), width), sn_init, 1, g, torch.device("cpu"))

    def real() -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.randint(0, len(x), (batch,), generator=g)
        return x[i], y[i]

    train_classifier(clf, real, real, steps, 0, "sequential", lam, lr, (0.5, 0.9), drift, loss=loss)
    p = {n: t[0] for n, t in clf.params.items()}
    u = {n: t[0] for n, t in clf.buffers.items()}
    with torch.no_grad():
        return (clf_logits(p, u, xt).argmax(1) == yt).float().mean().item()


def main(argv: list[str] | None = None) -> int:
    from dpgen.data import load_dataset
    from dpgen.data.torch_utils import to_float

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="fmnist")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--steps", type=int, nargs="+", default=[6, 20])
    ap.add_argument("--lrs", type=float, nargs="+", default=[4e-4, 2e-3, 1e-2])
    ap.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--batches", type=int, nargs="+", default=[64])
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    data = load_dataset(args.dataset, args.data_root or os.environ.get("DPGEN_DATA", "data"))
    x, y = to_float(torch.as_tensor(data.train.x)), torch.as_tensor(data.train.y).long()
    n = min(1000, len(data.test.y))
    xt, yt = to_float(torch.as_tensor(data.test.x[:n])), torch.as_tensor(data.test.y[:n]).long()
    print("loss lr batch steps: test accuracy per start")
    for loss in args.losses:
        for lr in args.lrs:
            for batch in args.batches:
                for steps in args.steps:
                    accs = [probe(x, y, xt, yt, loss, lr, steps, s, batch=batch) for s in range(args.starts)]
                    print(f"{loss} {lr:g} {batch} {steps}: " + " ".join(f"{a:.3f}" for a in accs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
