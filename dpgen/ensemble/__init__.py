"""Ensembles of K networks trained on K disjoint partitions: one stacked layout with per-member Adam
(:class:`MemberStack`) and its functional-network form with spectral-norm vectors (:class:`NetStack`), used by
gswgan, dpac, efsgd (discriminators, classifier, encoders) and gpate (teachers)."""
from dpgen.ensemble.functional import NetStack, batched_forward, functional_step
from dpgen.ensemble.stack import MemberStack, Params

__all__ = ["MemberStack", "NetStack", "Params", "batched_forward", "functional_step"]
