"""One-run privacy audit: lower bounds on ε from canaries in one training run.

``python scripts/audit.py method=<m> dataset=<d> eps=<ε>`` trains one run with m canaries, each included by a
secret fair coin, inserted white-box into the mechanisms' inputs before their bounds (:mod:`dpgen.audit.hooks`),
scores them by the log-likelihood ratio of the released noisy outputs (:mod:`dpgen.audit.canaries`), guesses,
and bounds ε from below at the configured confidence by two theorems: the f-DP one-run test of Mahloujifar,
Melis & Chaudhuri (ICML 2025) against the mechanism's own trade-off curve (:mod:`dpgen.audit.fdp`) and the
bound of Steinke, Nasr & Jagielski ("Privacy Auditing with One (1) Training Run", NeurIPS 2023;
:mod:`dpgen.audit.bound`), with a Gaussian-limit estimate beside them (:mod:`dpgen.audit.estimate`), in
``audit.json`` (:mod:`dpgen.audit.report`). docs/auditing.md says what it shows and what it cannot.
"""
from dpgen.audit.bound import epsilon_lower_bound, p_value
from dpgen.audit.canaries import Canaries, Channel, Guesses
from dpgen.audit.fdp import NoiseFamily, fdp_lower_bound

__all__ = ["Canaries", "Channel", "Guesses", "NoiseFamily", "epsilon_lower_bound", "fdp_lower_bound", "p_value"]
