"""One-run privacy audit (Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023).

``python scripts/audit.py method=<m> dataset=<d> eps=<ε>`` trains one run with m canaries, each included by a
secret fair coin, inserted white-box into the mechanisms' inputs before their bounds (:mod:`dpgen.audit.hooks`),
scores them from the released noisy outputs (:mod:`dpgen.audit.canaries`), guesses, and reports a
lower bound ε_lb on the run's ε at 95 % confidence (:mod:`dpgen.audit.bound`) in ``audit.json``
(:mod:`dpgen.audit.report`). docs/auditing.md says what it shows and what it cannot.
"""
from dpgen.audit.bound import epsilon_lower_bound, p_value
from dpgen.audit.canaries import Canaries, Channel, Guesses

__all__ = ["Canaries", "Channel", "Guesses", "epsilon_lower_bound", "p_value"]
