"""``dataset=celeba`` / ``dataset=ffhq``: a dataset family that resolves to the chosen method's paper setting.

The mapping is data, not code: ``configs/paper_dataset/<alias>_<method>.yaml`` pulls the concrete dataset's
config (``/dataset/celeba64@_here_``) in place of the alias's; configs/train.yaml selects it with the
defaults-list interpolation ``paper_dataset@dataset: ${dataset}_${method}``. This module only reads those
files back, to say which methods have a setting when one is missing.
"""
from __future__ import annotations

import re

from dpgen.core.methods import CONFIG_DIR

_CONCRETE = re.compile(r"^/dataset/(\w+)@_here_$")


def paper_settings(alias: str) -> dict[str, str]:
    """method -> concrete dataset for ``dataset=<alias>`` (from configs/paper_dataset/<alias>_<method>.yaml)."""
    import yaml

    out = {}
    for path in sorted((CONFIG_DIR / "paper_dataset").glob(f"{alias}_*.yaml")):
        defaults = (yaml.safe_load(path.read_text()) or {}).get("defaults", [])
        for entry in defaults:
            m = _CONCRETE.match(str(entry))
            if m:
                out[path.stem[len(alias) + 1:]] = m.group(1)
    return out


def alias_help(alias: str, method: str) -> str:
    """The one-line error for ``dataset=<alias>`` with a method whose paper has no such setting."""
    settings = paper_settings(alias)
    if not settings:
        return f"dataset={alias} is not a dataset; choose a concrete one (see configs/dataset/)"
    shown = ", ".join(f"{m}: {d}" for m, d in sorted(settings.items()))
    return (f"dataset={alias} has no paper setting for method={method} (settings exist for {shown}); "
            "choose one of those methods or a concrete dataset")
