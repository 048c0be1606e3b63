"""Why a generator's g2r figure is what it is: a diagnostic beside the evaluator (``scripts/probe_samples.py``).

For samples of a released generator it reports what a single fixed-schedule classifier (the evaluator's
fixed reading: all samples, last epoch, no selection) makes of them: its real-test accuracy with per-class
recall and confusion; ``label_consistency``, its accuracy on FRESH samples of the same generator (how
reliably a sample shows its label); the real test images' accuracy after the generator's own resolution path
(``work_size`` generators: down to the working size and back); per-class diversity (mean pairwise L2
distance, samples vs real); and sampling variants, each re-read by a new classifier: ``batch`` (batch
statistics, as the official G-PATE samples) and ``smooth`` (a 3×3 Gaussian blur of the samples, a
data-independent post-processing). It also writes per-class grids of samples and of real test images.
Nothing here is a metric of the run: ``metrics.json`` stays the evaluator's.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dpgen.core.generator import ReleasedGenerator, balanced_labels
from dpgen.data.base import ImageDataset
from dpgen.data.torch_utils import to_uint8
from dpgen.errors import DpgenError
from dpgen.eval import train_classifier as tc
from dpgen.eval.classifiers import build_classifier
from dpgen.eval.config import resolve_config

VARIANTS = ("batch", "smooth")


def _fixed_classifier(x: np.ndarray, y: np.ndarray, data: ImageDataset, epochs: int, device, seed: int):
    cfg = resolve_config(dict(classifiers=["cnn"], epochs=epochs, patience=None))
    model = build_classifier("cnn", data.shape, data.num_classes, seed)
    empty = np.arange(0)
    return tc.fit(model, x, y, x[empty], y[empty], cfg, device, seed)[0]


def _smooth(x: torch.Tensor) -> torch.Tensor:
    k = torch.exp(-torch.arange(-1.0, 2.0) ** 2 / 2)
    k = (k[:, None] * k[None]) / k.sum() ** 2
    c = x.shape[1]
    return F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), k.to(x).expand(c, 1, 3, 3), groups=c)


def _diversity(x: np.ndarray, y: np.ndarray, classes: int, per_class: int = 64) -> list[float]:
    out = []
    for c in range(classes):
        v = torch.from_numpy(x[np.flatnonzero(y == c)[:per_class]]).float().flatten(1) / 255
        out.append(round(float(torch.cdist(v, v).mean()), 3) if len(v) > 1 else None)
    return out


def _sample(gen: ReleasedGenerator, n: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    x, y = gen.sample(n, labels=balanced_labels(n, gen.num_classes), seed=seed)
    return x, y.numpy()


def probe(gen: ReleasedGenerator, data: ImageDataset, out_dir: str | Path, n: int = 10000, epochs: int = 10,
          seed: int = 0, device: str | torch.device = "cpu", variants: tuple[str, ...] = VARIANTS) -> dict:
    """The diagnostics of the module docstring for ``gen`` on ``data``; grids written to ``out_dir``."""
    from torchvision.utils import save_image

    if data.tabular:
        raise DpgenError("probe_samples reads image generators; this dataset is tabular")
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise DpgenError(f"variants={','.join(bad)} is invalid; expected a list drawn from {', '.join(VARIANTS)}")
    out_dir = Path(out_dir)
    k = data.num_classes
    x, y = _sample(gen, n, seed + 1)
    xs = to_uint8(x)
    rows = np.concatenate([np.flatnonzero(y == c)[:12] for c in range(k)])
    real_rows = np.concatenate([np.flatnonzero(data.test.y == c)[:12] for c in range(k)])
    save_image(torch.from_numpy(xs[rows]).float() / 255, out_dir / "samples_grid.png", nrow=12, padding=1)
    save_image(torch.from_numpy(data.test.x[real_rows]).float() / 255, out_dir / "real_grid.png", nrow=12, padding=1)

    model = _fixed_classifier(xs, y, data, epochs, device, seed)
    pred = tc.predict_logits(model, data.test.x, device).argmax(1)
    confusion = np.zeros((k, k), dtype=np.int64)
    np.add.at(confusion, (data.test.y, pred), 1)
    fresh_x, fresh_y = _sample(gen, min(n, 2000), seed + 2)
    res: dict = {
        "num_samples": n, "epochs": epochs,
        "real_test_accuracy": float((pred == data.test.y).mean()),
        "per_class_recall": (confusion.diagonal() / confusion.sum(1).clip(1)).round(3).tolist(),
        "confusion": confusion.tolist(),
        "label_consistency": tc.accuracy(model, to_uint8(fresh_x), fresh_y, device),
        "diversity_samples": _diversity(xs, y, k),
        "diversity_real": _diversity(data.test.x, data.test.y, k),
    }
    size, out_size = getattr(gen, "size", None), getattr(gen, "out_size", None)
    if size and out_size and size != out_size:  # a work_size generator: real images through its resolution path
        real = torch.from_numpy(data.test.x).float() / 255
        low = F.interpolate(F.interpolate(real, size=(size, size), mode="area"), size=(out_size, out_size),
                            mode="bilinear", align_corners=False)
        res["real_test_accuracy_at_work_size"] = tc.accuracy(model, to_uint8(low), data.test.y, device)
    res["variants"] = {}
    for v in variants:
        if v == "batch":
            if getattr(gen, "sample_stats", None) is None:
                continue
            saved = (gen.sample_stats, gen.sample_group)
            gen.sample_stats, gen.sample_group = "batch", max(int(gen.sample_group), 2)
            try:
                xv, yv = _sample(gen, n, seed + 1)
            finally:
                gen.sample_stats, gen.sample_group = saved
        else:
            xv, yv = _smooth(x), y
        res["variants"][v] = tc.accuracy(_fixed_classifier(to_uint8(xv), yv, data, epochs, device, seed),
                                         data.test.x, data.test.y, device)
    return res
