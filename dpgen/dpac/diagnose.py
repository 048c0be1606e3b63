"""``python -m dpgen.dpac.diagnose``: the GS-WGAN family's signal/noise probe, :mod:`dpgen.gswgan.diagnose`
(kept under its old name; ``--method`` chooses gswgan, dpac or efsgd)."""
from __future__ import annotations

import sys

from dpgen.gswgan.diagnose import main, measure, probe_paths, probe_step

__all__ = ["main", "measure", "probe_paths", "probe_step"]

if __name__ == "__main__":
    sys.exit(main())
