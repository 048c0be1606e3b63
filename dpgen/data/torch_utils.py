"""The single place where uint8 images and float tensors in [0, 1] are converted."""
from __future__ import annotations

import numpy as np
import torch


def to_float(x_uint8: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 array/tensor (any shape) -> float32 tensor in [0, 1].

    Refuses other dtypes: dividing an already-float tensor by 255 would be a silent bug.
    """
    t = torch.from_numpy(np.ascontiguousarray(x_uint8)) if isinstance(x_uint8, np.ndarray) else x_uint8
    if t.dtype != torch.uint8:
        raise TypeError(f"to_float expects uint8 images, got {t.dtype}")
    return t.to(torch.float32).div_(255.0)


def to_uint8(x_float01: torch.Tensor | np.ndarray) -> np.ndarray:
    """Float array/tensor in [0, 1] -> uint8 numpy array (clamped, rounded to nearest)."""
    t = torch.as_tensor(x_float01).detach().to("cpu", torch.float32)
    return t.clamp(0.0, 1.0).mul(255.0).round().to(torch.uint8).numpy()


def image_train_tensors(data, device: torch.device | str, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The training split as float images in [0, 1] and int64 labels on ``device``.

    For methods that train on images only: a tabular dataset is a one-line user error.
    """
    from dpgen.errors import DpgenError

    if data.tabular:
        raise DpgenError(f"{method} trains on images; dataset {data.name} is tabular (use method=gpate)")
    return to_float(data.train.x).to(device), torch.as_tensor(data.train.y, dtype=torch.long, device=device)
