#!/usr/bin/env python
"""The privacy-mutation gate (`make mutants`): single-line mutations of privacy-critical lines that the
test suite must kill.

Each mutant names a file, one line's exact original text (it must occur exactly once in that file), its
mutant, and the tests that must fail with it. The runner copies the tracked tree once into a scratch
directory, applies one mutant at a time, runs its tests there (``PYTHONPATH`` = the copy) and restores the
file. A mutant is killed only when its tests ran and at least one of them failed (read from pytest's JUnit
report). The runner exits 1 if any mutant survives (its tests pass), no longer applies (the original line
moved: update the entry), or leaves no verdict: a collection error (the mutant broke an import), a fixture's
error or a timeout is reported as such, never as a kill. So a refactor cannot silently retire a mutant, and a
mutant that crashes the test run proves nothing about the tests.

General mutation tools (mutmut, cosmic-ray) mutate every line and take hours here; this gate is the
curated list of the mutations that matter for privacy (issue 18), and runs in minutes.

    python tests/privacy_mutants.py            # all
    python tests/privacy_mutants.py dpgan      # the mutants whose id starts with "dpgan"
    python tests/privacy_mutants.py --list
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    original: str
    mutant: str
    tests: tuple[str, ...]
    why: str = ""


DPGAN_WIRING = "tests/test_dpgan_wiring.py"
FETA_WIRING = "tests/test_feta_wiring.py"
DPAF_SPY = "tests/test_dpaf_wiring.py::test_spy_sigma_clip_and_batches_match_the_ledger"
DPAF_DPSGD = "tests/test_dpaf_dpsgd.py"
SECRET = "tests/test_secret_randomness.py"
PRECISION = "tests/test_precision.py"
LEDGER = "tests/test_privacy_ledger.py"
CALIBRATE = "tests/test_privacy_calibrate.py"
AUDIT_BELOW = "tests/test_audit.py::test_audit_stays_below_the_claimed_epsilon"
GHOST = "tests/test_ghost.py"
SAMPLING = "tests/test_privacy_sampling.py"

MUTANTS: list[Mutant] = [
    # -- dpgan -------------------------------------------------------------------------------------------
    Mutant("dpgan.sigma_half", "dpgen/dpgan/train.py",
           "noise_multiplier=sigma, max_grad_norm=float(hp.clip),",
           "noise_multiplier=sigma * 0.5, max_grad_norm=float(hp.clip),",
           (DPGAN_WIRING + "::test_sigma_clip_and_poisson_batch_match_the_ledger",),
           "σ × 0.5 passed to the DPOptimizer"),
    Mutant("dpgan.clip_x100", "dpgen/dpgan/train.py",
           "noise_multiplier=sigma, max_grad_norm=float(hp.clip),",
           "noise_multiplier=sigma, max_grad_norm=float(hp.clip) * 100,",
           (DPGAN_WIRING + "::test_sigma_clip_and_poisson_batch_match_the_ledger",),
           "clip × 100"),
    Mutant("dpgan.guard_removed", "dpgen/dpgan/train.py",
           "            if not guard.allows():",
           "            if False:",
           (DPGAN_WIRING + "::test_budget_guard_stops_exactly_at_the_limit",),
           "budget-guard check removed"),
    Mutant("dpgan.fixed_batch", "dpgen/dpgan/train.py",
           '            idx = poisson_batch(n, q, g_sample, dev)',
           '            idx = torch.randperm(n, generator=g_sample, device=dev)[:batch]',
           (DPGAN_WIRING + "::test_sigma_clip_and_poisson_batch_match_the_ledger",),
           "Poisson batch replaced by a fixed-size random batch"),
    # -- feta / dpdm (one training loop) -----------------------------------------------------------------
    Mutant("feta.sigma_half", "dpgen/feta/train.py",
           'set_noisy_grads(params, sums, sigma, float(hp.clip), q * n, gens["noise"])',
           'set_noisy_grads(params, sums, sigma * 0.5, float(hp.clip), q * n, gens["noise"])',
           (FETA_WIRING + "::test_mechanisms_receive_what_the_ledger_records",),
           "DP-SGD σ × 0.5 in training"),
    Mutant("feta.clip_x10", "dpgen/feta/train.py",
           "sums, loss = clipped_grad_sum_func(model.net, xb, yb, int(hp.multiplicity), float(hp.clip),",
           "sums, loss = clipped_grad_sum_func(model.net, xb, yb, int(hp.multiplicity), float(hp.clip) * 10,",
           (FETA_WIRING + "::test_mechanisms_receive_what_the_ledger_records",),
           "per-record clip × 10"),
    Mutant("feta.guard_removed", "dpgen/feta/train.py",
           "        if not guard.allows():",
           "        if False:",
           (FETA_WIRING + "::test_budget_guard_stops_at_the_last_allowed_step",),
           "budget-guard check removed"),
    Mutant("feta.central_sigma_half", "dpgen/feta/train.py",
           "sigma=0.0 if ledger.privacy_off else float(hp.central_sigma),",
           "sigma=0.0 if ledger.privacy_off else float(hp.central_sigma) * 0.5,",
           (FETA_WIRING + "::test_mechanisms_receive_what_the_ledger_records",),
           "central-image σ × 0.5"),
    Mutant("feta.central_mean_sensitivity_half", "dpgen/feta/central.py",
           "return _release(sums, clip, sigma, ledger, MEAN_ENTRY, q, generator) / expected_batch",
           "return _release(sums, clip * 0.5, sigma, ledger, MEAN_ENTRY, q, generator) / expected_batch",
           (FETA_WIRING + "::test_mechanisms_receive_what_the_ledger_records",),
           "mean-image noise at half the clip bound (σ × 0.5 in effect)"),
    Mutant("feta.central_mode_sensitivity_half", "dpgen/feta/central.py",
           "return _release(hist, math.sqrt(math.prod(xb.shape[1:])), sigma, ledger, MODE_ENTRY, q, generator)",
           "return _release(hist, 0.5 * math.sqrt(math.prod(xb.shape[1:])), sigma, ledger, MODE_ENTRY, q, generator)",
           (FETA_WIRING + "::test_mechanisms_receive_what_the_ledger_records",),
           "mode-image noise at half the sensitivity"),
    Mutant("feta.central_full_resolution", "dpgen/feta/central.py",
           "        xb, yb = shrink(x[idx], low), y[idx]",
           "        xb, yb = x[idx], y[idx]",
           (FETA_WIRING + "::test_mechanisms_receive_what_the_ledger_records",),
           "official query at full resolution with the half-resolution clip/sensitivity"),
    Mutant("feta.batch_not_poisson", "dpgen/feta/train.py",
           "        xb = x_all[idx] * 2 - 1",
           "        xb = x_all[:len(idx)] * 2 - 1",
           (FETA_WIRING + "::test_mechanisms_receive_what_the_ledger_records",),
           "DP-SGD reads other records than the Poisson batch"),
    # -- dpaf (issue 16/18) ------------------------------------------------------------------------------
    Mutant("dpaf.z3_half", "dpgen/dpaf/train.py",
           'real_aggs = [dpagg(d_net.features(x_all[s], y_all[s], eps_sin), sens, z3, bsz, g_agg, agg_canaries, j)',
           'real_aggs = [dpagg(d_net.features(x_all[s], y_all[s], eps_sin), sens, z3 * 0.5, bsz, g_agg, agg_canaries, j)',
           (DPAF_SPY,), "DPAGG z3 × 0.5 in training"),
    Mutant("dpaf.z2_half", "dpgen/dpaf/train.py", "float(hp.lr_d), z2, float(hp.clip_d)",
           "float(hp.lr_d), z2 * 0.5, float(hp.clip_d)", (DPAF_SPY,), "conv2* DP-SGD z2 × 0.5"),
    Mutant("dpaf.z1_half", "dpgen/dpaf/train.py", "float(hp.lr_c), z1, float(hp.clip_c)",
           "float(hp.lr_c), z1 * 0.5, float(hp.clip_c)", (DPAF_SPY,), "conv1 (phase-1 C) DP-SGD z1 × 0.5"),
    Mutant("dpaf.clip_d_x2", "dpgen/dpaf/train.py", "z2, float(hp.clip_d), mu * bsz",
           "z2, float(hp.clip_d) * 2, mu * bsz", (DPAF_SPY,), "conv2* clip × 2"),
    Mutant("dpaf.clip_c_x2", "dpgen/dpaf/train.py", "z1, float(hp.clip_c), bc",
           "z1, float(hp.clip_c) * 2, bc", (DPAF_SPY,), "phase-1 C clip × 2"),
    Mutant("dpaf.sound_c_coupled", "dpgen/dpaf/train.py", "k, bc, paper, eps_sin)", "k, bc, True, eps_sin)",
           (DPAF_SPY,), "sound C trained on the batch-coupled (paper) loss"),
    Mutant("dpaf.sound_conv2_coupled", "dpgen/dpaf/train.py", "subs, idx, fakes, paper, eps_sin)",
           "subs, idx, fakes, True, eps_sin)", (DPAF_SPY,), "sound conv2* trained on the batch-coupled loss"),
    Mutant("dpaf.guard_removed", "dpgen/dpaf/train.py", "        if not budget.group_step():",
           "        if not budget.group_step() and False:",
           ("tests/test_dpaf_wiring.py::test_budget_guard_binds_with_a_fixed_sigma",), "group budget guard removed"),
    Mutant("dpaf.fixed_batch", "dpgen/dpaf/train.py", "        idx = sample_d(g)",
           "        idx = torch.randperm(n, device=dev)[:mu * bsz]", (DPAF_SPY,),
           "Poisson group replaced by a fixed-size random batch"),
    Mutant("dpaf.dpagg_noise_half", "dpgen/dpaf/mechanisms.py",
           "gaussian_noise(total.shape, noise_multiplier * sensitivity, generator",
           "gaussian_noise(total.shape, noise_multiplier * sensitivity * 0.5, generator",
           (DPAF_SPY, "tests/test_dpaf_mechanisms.py"),
           "DPAGG noise std halved inside the mechanism"),
    Mutant("dpaf.sensitivity_half", "dpgen/dpaf/train.py", "    sens = d_net.sensitivity",
           "    sens = d_net.sensitivity * 0.5", (DPAF_SPY,), "DPAGG sensitivity √m·p halved"),
    Mutant("dpaf.overlapping_split", "dpgen/dpaf/mechanisms.py", "return [perm[j::mu] for j in range(mu)]",
           "return [perm[j:] for j in range(mu)]", (DPAF_SPY,),
           "the μ batches of a group overlap (one record in several batches)"),
    Mutant("dpaf.real_aggs_noiseless", "dpgen/dpaf/train.py",
           'real_aggs = [dpagg(d_net.features(x_all[s], y_all[s], eps_sin), sens, z3, bsz, g_agg, agg_canaries, j)',
           "real_aggs = [d_net.features(x_all[s], y_all[s], eps_sin).sum(0) / bsz",
           ("tests/test_dpaf_wiring.py::test_generator_depends_on_data_only_through_the_mechanisms",),
           "real aggregates computed without DPAGG (no noise)"),
    Mutant("dpaf.q1_half", "dpgen/dpaf/train.py", "sample_c = _sampler(run, n, q1, 1, t1)",
           "sample_c = _sampler(run, n, q1 / 2, 1, t1)", (DPAF_SPY,), "phase-1 Poisson rate halved vs the ledger"),
    Mutant("dpaf.one_group_sigma", "dpgen/dpaf/accounting.py", "self.zs = [z3, z2]", "self.zs = [z2]",
           (DPAF_SPY, "tests/test_dpaf_accounting.py"), "the joint event records one of its two Gaussians"),
    # an empty Poisson batch releases pure noise; conv1=transfer|random|joint decides what phase 2's DP-SGD covers
    Mutant("dpaf.empty_batch_skipped", "dpgen/dpaf/train.py", "                opt_c.empty_step()",
           "                pass", (DPAF_DPSGD + "::test_an_empty_poisson_batch_releases_pure_noise_and_is_recorded",),
           "an empty phase-1 batch is skipped, not released as noise (the skip reveals it)"),
    Mutant("dpaf.empty_step_releases_nothing", "dpgen/dpaf/mechanisms.py", "        self.step()",
           "        self.original_optimizer.step()",
           (DPAF_DPSGD + "::test_an_empty_poisson_batch_releases_pure_noise_and_is_recorded",),
           "empty_step takes the optimizer's step without DP-SGD's noise (nothing released)"),
    Mutant("dpaf.joint_conv1_outside_dpsgd", "dpgen/dpaf/train.py",
           "    dp_block = nn.ModuleList([d_net.conv1, d_net.conv2]) if joint else d_net.conv2",
           "    dp_block = d_net.conv2",
           (DPAF_DPSGD + "::test_phase2_dp_sgd_clips_and_noises_exactly_conv2_or_with_joint_conv1_too[joint]",),
           "conv1=joint: conv1 left out of phase 2's DP-SGD (neither clipped, noised nor trained)"),
    Mutant("dpaf.random_conv1_trained", "dpgen/dpaf/train.py", '    joint = hp.conv1 == "joint"',
           '    joint = hp.conv1 != "transfer"',
           (DPAF_DPSGD + "::test_phase2_dp_sgd_clips_and_noises_exactly_conv2_or_with_joint_conv1_too[random]",),
           "conv1=random: the random conv1 is trained with conv2* (Table IV: never updated)"),
    # -- gpate -------------------------------------------------------------------------------------------
    Mutant('gpate.sigma2_half', 'dpgen/gpate/train.py',
           'cfg["sigma1"], cfg["sigma2"], cfg["threshold"], proj_gen',
           'cfg["sigma1"], cfg["sigma2"] * 0.5, cfg["threshold"], proj_gen',
           ('tests/test_gpate_train.py::test_spy_mechanisms_receive_what_the_ledger_records',),
           'σ2 × 0.5 passed to DPGradAgg'),
    Mutant('gpate.sigma1_half', 'dpgen/gpate/train.py',
           'cfg["sigma1"], cfg["sigma2"], cfg["threshold"], proj_gen',
           'cfg["sigma1"] * 0.5, cfg["sigma2"], cfg["threshold"], proj_gen',
           ('tests/test_gpate_train.py::test_spy_mechanisms_receive_what_the_ledger_records',),
           'σ1 × 0.5 passed to DPGradAgg'),
    Mutant('gpate.clip_c_x2', 'dpgen/gpate/train.py',
           'tuple(xd.shape[1:]), cfg["c"], cfg["bins"]',
           'tuple(xd.shape[1:]), cfg["c"] * 2, cfg["bins"]',
           ('tests/test_gpate_train.py::test_spy_mechanisms_receive_what_the_ledger_records',),
           'clipping constant c × 2'),
    Mutant('gpate.teacher_batch_shifted', 'dpgen/gpate/train.py',
           'i = idx[a:b]',
           'i = idx[a:b].roll(1, 0)',
           ('tests/test_gpate_train.py::test_spy_mechanisms_receive_what_the_ledger_records', 'tests/test_gpate_train.py::test_teachers_are_isolated_from_each_others_records'),
           "teacher t reads teacher t−1's records"),
    Mutant('gpate.partition_offsets_rolled', 'dpgen/gpate/ensemble.py',
           'self.order[(self.offsets[:, None] + local)',
           'self.order[(self.offsets.roll(1)[:, None] + local)',
           ('tests/test_gpate_train.py::test_spy_mechanisms_receive_what_the_ledger_records',),
           "partition offsets rolled (teacher reads another's records)"),
    Mutant('gpate.teacher_fakes_other_labels', 'dpgen/gpate/train.py',
           'xf = g_net(zz, yr.reshape(-1), group=m)',
           'xf = g_net(zz, yr.roll(1, 0).reshape(-1), group=m)',
           ('tests/test_gpate_train.py::test_teachers_are_isolated_from_each_others_records',),
           "teacher fakes from another teacher's labels"),
    Mutant('gpate.guard_removed', 'dpgen/gpate/train.py',
           'iters = min(iters, run.start_step + guard.remaining // queries_per_iter)',
           'iters = iters',
           ('tests/test_gpate_train.py::test_budget_guard_stops_exactly_at_its_limit',),
           'budget guard removed'),
    Mutant('gpate.rdp_argmax_scale', 'dpgen/gpate/rdp.py',
           'argmax = float(sigma2) / SQRT2',
           'argmax = float(sigma2)',
           ('tests/test_gpate_train.py::test_spy_mechanisms_receive_what_the_ledger_records',),
           'argmax RDP scale without the √2'),
    Mutant('gpate.prior_laplace_half', 'dpgen/gpate/train.py',
           'noise = laplace_noise(num_classes, b, generator)',
           'noise = laplace_noise(num_classes, b * 0.5, generator)',
           ('tests/test_gpate_train.py::test_spy_laplace_prior_matches_its_ledger_entry',),
           'Laplace class prior at half its scale'),
    Mutant('gpate.paper_stop_x2', 'dpgen/gpate/train.py',
           'if rdp.classic_epsilon(self.rdp_cum + rdp_it, self.ledger.delta) > self._budget():',
           'if rdp.classic_epsilon(self.rdp_cum + rdp_it, self.ledger.delta) > 2 * self._budget():',
           ('tests/test_gpate_train.py::test_paper_accounting_stops_where_the_data_dependent_epsilon_would_cross',),
           'paper stop at 2× the budget'),
    Mutant('gpate.paper_stop_plus1', 'dpgen/gpate/rdp.py',
           'k = np.floor(slack / np.asarray(per_iteration_bound))',
           'k = np.floor(slack / np.asarray(per_iteration_bound)) + 1',
           ('tests/test_gpate_privacy.py::test_safe_iterations_is_the_largest_count_that_certainly_stays_within_budget',
            'tests/test_gpate_train.py::test_paper_accounting_stops_where_the_data_dependent_epsilon_would_cross'),
           'paper stop one iteration late'),
    Mutant('gpate.inf_data_dependent', 'dpgen/gpate/train.py',
           'if paper and not ledger.privacy_off else None',
           'if paper else None',
           ('tests/test_gpate_train.py::test_eps_inf_is_clean_under_both_accountings',),
           'eps=inf charges data-dependent RDP'),
    Mutant('gpate.argmax_noise_half', 'dpgen/gpate/aggregate.py',
           'noisy = counts + gaussian_noise(counts.shape, sigma2, generator',
           'noisy = counts + gaussian_noise(counts.shape, sigma2 * 0.5, generator',
           ('tests/test_gpate_privacy.py::test_threshold_and_argmax_noise_stds_are_sigma1_and_sigma2',),
           'argmax noise × 0.5 in the aggregator'),
    Mutant('gpate.threshold_noise_half', 'dpgen/gpate/aggregate.py',
           'real.max(dim=1).values + gaussian_noise((q,), sigma1, generator',
           'real.max(dim=1).values + gaussian_noise((q,), sigma1 * 0.5, generator',
           ('tests/test_gpate_privacy.py::test_threshold_and_argmax_noise_stds_are_sigma1_and_sigma2',),
           'threshold noise × 0.5 in the aggregator'),
    Mutant('gpate.threshold_half', 'dpgen/gpate/train.py',
           '"threshold": None if thresh is None else float(thresh) * n_t,',
           '"threshold": None if thresh is None else float(thresh) * n_t * 0.5,',
           ('tests/test_gpate_train.py::test_spy_mechanisms_receive_what_the_ledger_records',),
           'threshold × 0.5'),
    Mutant('gpate.paper_rdp_zeroed', 'dpgen/gpate/rdp.py',
           'total = total + rdp_gaussian(compute_logq_gaussian(counts[answered], sigma2), sigma2, orders).sum(axis=0)',
           'total = total + 0 * rdp_gaussian(compute_logq_gaussian(counts[answered], sigma2), sigma2, orders).sum(axis=0)',
           ('tests/test_gpate_ensemble.py::test_paper_accounting_and_credit_prior_match_the_oracle',),
           'data-dependent RDP of answered queries dropped'),
    Mutant('gpate.ledger_one_query', 'dpgen/gpate/train.py',
           'ledger.record(ENTRY, nm, count=queries_per_iter)',
           'ledger.record(ENTRY, nm, count=1)',
           ('tests/test_gpate_train.py::test_spy_mechanisms_receive_what_the_ledger_records',),
           'ledger charges one query per iteration'),
    # -- the shared ensemble layout (dpgen/ensemble: gswgan/dpac/efsgd discriminators, gpate teachers) -------------
    Mutant('ensemble.block_grads_mixed_across_members', 'dpgen/ensemble/stack.py',
           '        grads = [g.contiguous() for g in grads]',
           '        grads = [(g / g.norm()).contiguous() for g in grads]',
           ('tests/test_ensemble.py::test_block_path_isolates_every_other_member',),
           "a lockstep block's update depends on its other members' gradients"),
    Mutant('ensemble.rows_moment_reads_other_members', 'dpgen/ensemble/stack.py',
           '            m = self.m[n][idx].mul(b1).add_(g, alpha=1 - b1)',
           '            m = self.m[n][idx].mul(b1).add_(g, alpha=1 - b1) + 1e-3 * self.m[n].mean(0)',
           ('tests/test_ensemble.py::test_rows_path_isolates_every_other_member',),
           "a sampled member's Adam moment reads every member's"),
    # precision=bf16 / ensemble.conv=batched for the stacked ensembles (dpgen/ensemble/compute.py, functional.py)
    Mutant('ensemble.bf16_member_grads', 'dpgen/ensemble/functional.py',
           '    return vmap(grad(loss_and_aux, has_aux=True))(p, u, *inputs)',
           '    return vmap(grad(loss_and_aux, has_aux=True))(to_compute(p, dtype), u, *inputs)',
           ('tests/test_bf16_ensemble.py::test_bf16_keeps_master_weights_gradients_and_adam_state_fp32',),
           "under bf16 the members' gradients (Adam's input) are bf16, not fp32"),
    Mutant('ensemble.batched_conv_mixes_members', 'dpgen/ensemble/compute.py',
           '    cols = cols.reshape(n, groups, cin_g * kh * kw, oh * ow)',
           '    cols = cols.reshape(n, groups, cin_g * kh * kw, oh * ow).roll(1, 1)',
           ('tests/test_ensemble_compute.py::test_batched_layout_teacher_step_and_votes_equal_grouped',),
           "ensemble.conv=batched: teacher i's convolution reads teacher i-1's feature maps"),
    Mutant('gpate.teacher_votes_in_bf16', 'dpgen/gpate/ensemble.py',
           'yield a, b, -g.float()',
           'yield a, b, -g.bfloat16()',
           ('tests/test_ensemble_compute.py::test_batched_layout_teacher_step_and_votes_equal_grouped',),
           "the teachers' image gradients (the votes' inputs) leave the ensemble in bf16"),
    # -- gswgan / dpac / efsgd (dpgen/gswgan, dpgen/dpac, dpgen/efsgd) ----------------------------------------------------
    Mutant('dpac.d_path_sigma_x0_5', 'dpgen/dpac/method.py',
           'san_d = Sanitizer(float(hp.clip), z_noise, base.noise_gen, basis)',
           'san_d = Sanitizer(float(hp.clip), z_noise * 0.5, base.noise_gen, basis)',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger',),
           'dpac D-path sigma x0.5'),
    Mutant('dpac.d_path_clip_x2', 'dpgen/dpac/method.py',
           'san_d = Sanitizer(float(hp.clip), z_noise, base.noise_gen, basis)',
           'san_d = Sanitizer(float(hp.clip) * 2, z_noise, base.noise_gen, basis)',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger',),
           'dpac D-path clip x2'),
    Mutant('dpac.c_path_sigma_x0_5', 'dpgen/dpac/method.py',
           'san_c = None if joint else Sanitizer(float(hp.clip), z_noise, base.noise_gen, basis)',
           'san_c = None if joint else Sanitizer(float(hp.clip), z_noise * 0.5, base.noise_gen, basis)',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[dpac_per_path]',),
           'dpac C-path sigma x0.5'),
    Mutant('dpac.c_path_clip_x2', 'dpgen/dpac/method.py',
           'san_c = None if joint else Sanitizer(float(hp.clip), z_noise, base.noise_gen, basis)',
           'san_c = None if joint else Sanitizer(float(hp.clip) * 2, z_noise, base.noise_gen, basis)',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[dpac_per_path]',),
           'dpac C-path clip x2'),
    Mutant('gswgan.d_path_sigma_x0_5', 'dpgen/gswgan/train.py',
           'self.san_d = Sanitizer(float(hp.clip), z_noise, base.noise_gen, basis)',
           'self.san_d = Sanitizer(float(hp.clip), z_noise * 0.5, base.noise_gen, basis)',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[gswgan]',),
           'GS-WGAN D-path sigma x0.5'),
    Mutant('gswgan.sanitizer_noise_x0_5', 'dpgen/gswgan/sanitizer.py',
           'noise = gaussian_noise(signal.shape, self.noise_std, self.generator',
           'noise = gaussian_noise(signal.shape, self.noise_std * 0.5, self.generator',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[dpac]',),
           'sanitizer noise x0.5 (inside the mechanism)'),
    Mutant('gswgan.sanitizer_clip_x2', 'dpgen/gswgan/sanitizer.py',
           'clipped = clip_rows(rows, self.clip)',
           'clipped = clip_rows(rows, self.clip * 2)',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[gswgan]',),
           'sanitizer clips at 2C (inside the mechanism)'),
    Mutant('gswgan.basis_release_drops_the_noise', 'dpgen/gswgan/sanitizer.py',
           'release = release @ self.basis.T',
           'release = signal @ self.basis.T',
           ('tests/test_dpac_sanitizer.py::test_a_basis_sanitiser_clips_and_noises_the_coefficients_and_releases_only_their_span',),
           'dpac.grad_basis: G receives the clipped coefficients without their noise'),
    Mutant('gswgan.critic_reads_all_records', 'dpgen/gswgan/train.py',
           '        idx = parts.sample(k, b, g)\n',
           '        idx = torch.randint(0, len(x_all), (k.shape[0], b), generator=g, device=x_all.device)\n',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[gswgan]',),
           'critic samples from ALL records instead of partition k'),
    Mutant('gswgan.pretrain_critic_reads_all_records', 'dpgen/gswgan/train.py',
           '                idx = parts.sample(members, b, gc)',
           '                idx = torch.randint(0, len(x_all), (len(members), b), generator=gc, device=dev)',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[gswgan]', 'tests/test_dpac_isolation.py'),
           'pre-training critic samples from ALL records'),
    Mutant('dpac.classifier_reads_partition_k_1', 'dpgen/dpac/method.py',
           '        i = parts.sample(k, b, data_gen)\n        return x_all[i], y_all[i]\n\n    def fake_batch',
           '        i = parts.sample((k + 1) % len(parts.sizes), b, data_gen)\n        return x_all[i], y_all[i]\n\n'
           '    def fake_batch',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[dpac]',),
           'classifier reads partition k+1'),
    Mutant('gswgan.pretrain_shared_warmup_fakes', 'dpgen/gswgan/train.py',
           '                    xf = gens(z_draw(), yr)',
           '                    xf = gens(z_draw(), yr)[:1].expand(m, -1, -1, -1, -1)',
           ('tests/test_dpac_isolation.py',),
           "pre-training: every D of a chunk trains on warm-up generator 0's fakes"),
    Mutant('dpac.joint_c_path_reads_raw_images', 'dpgen/gswgan/train.py',
           '        release = san_d.sanitize_sum(rows, scale)\n',
           '        release = san_d.sanitize_sum(member_rows(x, y, [d_term])[0], scale) + (\n'
           '            member_rows(x, y, [c_term])[0].sum(0) / b if c_term else 0)\n',
           ('tests/test_dpac_sanitizer.py::test_generator_update_depends_on_data_only_through_the_sanitised_release',),
           "joint sanitiser: C's gradient reaches G unsanitised"),
    Mutant('dpac.c_path_not_recorded_in_the_ledger', 'dpgen/dpac/method.py',
           'paths = (zp, zp) if with_c and not joint else (zp,)',
           'paths = (zp,) if with_c and not joint else (zp,)',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[dpac_per_path]',),
           'C path not recorded in the ledger'),
    Mutant('dpac.budget_guard_check_removed', 'dpgen/gswgan/train.py',
           '        if not self.guards[multipliers].allows():',
           '        if False:',
           ('tests/test_dpac_spy.py::test_budget_guard_stops_at_the_last_allowed_iteration',),
           'dpac budget guard check removed'),
    Mutant('dpac.paper_cap_removed', 'dpgen/gswgan/train.py',
           '            if it >= self.paper_cap:',
           '            if False:',
           ('tests/test_dpac_spy.py::test_paper_budget_stops_at_the_paper_analysis_cap',),
           'paper cap removed'),
    # Poisson partition sampling (docs/privacy.md, "Sampling partitions")
    Mutant('gswgan.partition_rate_x2', 'dpgen/gswgan/train.py',
           'return poisson_batch(self.K, min(1.0, self.per_iter / self.K), base.data_gen, self.run.device)',
           'return poisson_batch(self.K, min(1.0, 2 * self.per_iter / self.K), base.data_gen, self.run.device)',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[gswgan]',),
           'partitions sampled at twice the rate the ledger records'),
    Mutant('gswgan.sum_clipped_not_each_row', 'dpgen/gswgan/sanitizer.py',
           '            signal = clipped.reshape(*members, *rows.shape[1:]).sum(0)',
           '            signal = clip_rows(rows.reshape(*members, *rows.shape[1:]).sum(0), self.clip)',
           ('tests/test_dpac_sanitizer.py::test_several_partitions_each_row_clipped_summed_then_one_noise_draw_per_image',),
           "the sampled members' rows are summed before the clip (one clip per image, not per member)"),
    Mutant('gswgan.critic_fakes_from_the_public_stream', 'dpgen/gswgan/train.py',
           '            xf, yf = fake(b, None, g)\n',
           '            xf, yf = fake(b * max(m, 1), None)\n            xf, yf = xf[:b], yf[:b]\n',
           ('tests/test_dpac_isolation.py::test_the_public_stream_does_not_see_how_many_partitions_were_sampled',),
           "the critic fakes' count (the secret sample's size) shifts the public stream of G's latents"),
    Mutant('gswgan.batches_drawn_for_the_members_only', 'dpgen/gswgan/train.py',
           'u = torch.rand(len(self.sizes), b, generator=g, device=self.mat.device).index_select(0, members)',
           'u = torch.rand(len(members), b, generator=g, device=self.mat.device)',
           ('tests/test_dpac_isolation.py::test_sampling_one_more_partition_changes_only_that_partitions_states',),
           "partition j's batches depend on which other partitions were sampled"),
    Mutant('gswgan.uniform_draw_allowed_by_the_schema', 'dpgen/core/hparams/gswgan.py',
           '    if node.sampling == "uniform" and privacy_on(ctx):',
           '    if False:',
           ('tests/test_dpac_config.py::test_the_uniform_draw_is_refused_where_a_valid_bound_is_claimed',),
           'the uniform draw (no valid bound) accepted under sound accounting by the config check'),
    Mutant('gswgan.uniform_draw_allowed_by_train', 'dpgen/gswgan/train.py',
           '    if ledger.accounting == "sound" and not ledger.privacy_off:\n        raise DpgenError(f"{prefix}.sampling',
           '    if False:\n        raise DpgenError(f"{prefix}.sampling',
           ('tests/test_dpac_config.py::test_train_refuses_the_uniform_draw_under_sound_accounting',),
           'the uniform draw (no valid bound) trained under sound accounting'),
    Mutant('efsgd.prior_targets_from_another_partition', 'dpgen/efsgd/train.py',
           '    targets = torch.gather(xr, 1, j.view(',
           '    targets = torch.gather(xr.roll(1, 0), 1, j.view(',
           ('tests/test_efsgd_sanitizer.py::test_prior_code_nearest_targets_are_same_class_records_closest_to_g',
            'tests/test_dpac_isolation.py::test_one_record_changes_only_its_own_partitions_states[efsgd]'),
           "efsgd encoder.code=prior: partition j's reconstruction targets come from partition j-1's batch"),
    Mutant('efsgd.d_path_sigma_x0_5', 'dpgen/efsgd/train.py',
           'san = {name: ErrorFeedbackSanitizer(c1, z_noise, c2,',
           'san = {name: ErrorFeedbackSanitizer(c1, z_noise * (0.5 if name == "d" else 1.0), c2,',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[efsgd]',),
           'efsgd D-path sigma x0.5'),
    Mutant('efsgd.c_path_sigma_x0_5', 'dpgen/efsgd/train.py',
           'san = {name: ErrorFeedbackSanitizer(c1, z_noise, c2,',
           'san = {name: ErrorFeedbackSanitizer(c1, z_noise * (0.5 if name == "c" else 1.0), c2,',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[efsgd]',),
           'efsgd C-path sigma x0.5'),
    Mutant('efsgd.clip_x2', 'dpgen/efsgd/train.py',
           'san = {name: ErrorFeedbackSanitizer(c1, z_noise, c2,',
           'san = {name: ErrorFeedbackSanitizer(c1 * 2, z_noise, c2,',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[efsgd]',),
           'efsgd clip x2'),
    Mutant('efsgd.released_code_noise_x0_5', 'dpgen/efsgd/train.py',
           'code = encoder_input(enc_forward(pe, ue, x_rec), y_rec, ncls, private_code, code_clip, code_std,',
           'code = encoder_input(enc_forward(pe, ue, x_rec), y_rec, ncls, private_code, code_clip, code_std * 0.5,',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[efsgd_private_uniform]',),
           'efsgd released code noise x0.5'),
    Mutant('efsgd.released_code_noise_0', 'dpgen/efsgd/train.py',
           'code = encoder_input(enc_forward(pe, ue, x_rec), y_rec, ncls, private_code, code_clip, code_std,',
           'code = encoder_input(enc_forward(pe, ue, x_rec), y_rec, ncls, private_code, code_clip, 0.0,',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[efsgd_private_uniform]',),
           'efsgd released code noise = 0'),
    Mutant('efsgd.code_noise_x0_5_inside_encoder_input', 'dpgen/efsgd/train.py',
           '    return clip_rows(u, code_clip) + gaussian_noise(u.shape, code_std, g,',
           '    return clip_rows(u, code_clip) + gaussian_noise(u.shape, code_std * 0.5, g,',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[efsgd_private_uniform]',),
           'efsgd code noise x0.5 inside encoder_input'),
    Mutant('efsgd.error_noise_x0_5_inside_the_ef_sanitizer', 'dpgen/efsgd/sanitizer.py',
           'noise = gaussian_noise(v.shape, self.noise_std, self.generator',
           'noise = gaussian_noise(v.shape, self.noise_std * 0.5, self.generator',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[efsgd]',),
           'efsgd error noise x0.5 inside the EF sanitizer'),
    Mutant('efsgd.error_state_shared_by_all_partitions', 'dpgen/efsgd/sanitizer.py',
           '        k = torch.as_tensor(k, device=g.device).reshape(-1)',
           '        k = torch.zeros_like(torch.as_tensor(k, device=g.device).reshape(-1))',
           ('tests/test_dpac_isolation.py::test_one_record_changes_only_its_own_partitions_states[efsgd]',
            'tests/test_dpac_isolation.py::test_sampling_one_more_partition_changes_only_that_partitions_states[efsgd]'),
           'efsgd error state shared by all partitions'),
    Mutant('efsgd.error_clip_c2_x2', 'dpgen/efsgd/sanitizer.py',
           'e_clipped = clip_rows(e_k[:, y].reshape(m * b, *shape), self.clip_error)',
           'e_clipped = clip_rows(e_k[:, y].reshape(m * b, *shape), self.clip_error * 2)',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[efsgd]',),
           'efsgd error clip C2 x2'),
    Mutant('efsgd.encoder_reads_all_records', 'dpgen/efsgd/train.py',
           '            x_rec, y_rec = xr[0], yr[0]',
           '            x_rec, y_rec = self.x_all[:len(xr[0])], self.y_all[:len(xr[0])]',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[efsgd_private_uniform]',),
           'efsgd encoder reads all records'),
    # efsgd.sanitize=joint (one sanitiser on -D - lambda_c*C), encoder.code=prior (a public code), C2 < C1 (sound rule)
    Mutant('efsgd.joint_path_sigma_x0_5', 'dpgen/efsgd/train.py',
           'san = {name: ErrorFeedbackSanitizer(c1, z_noise, c2,',
           'san = {name: ErrorFeedbackSanitizer(c1, z_noise * (0.5 if name == "d" else 1.0), c2,',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[efsgd_joint]',),
           'efsgd joint (D + lambda_c C) path sigma x0.5'),
    Mutant('efsgd.joint_c_path_reads_raw_images', 'dpgen/efsgd/train.py',
           '        rows, loss = member_rows(x, y, [d_term, c_term])\n'
           '        release = san["d"].sanitize_sum(rows, members, y, scale)\n',
           '        rows, loss = member_rows(x, y, [d_term])\n'
           '        release = san["d"].sanitize_sum(rows, members, y, scale) + member_rows(x, y, [c_term])[0].sum(0) / b\n',
           ('tests/test_efsgd_sanitizer.py::test_joint_release_is_the_one_sanitised_weighted_sum_and_all_that_reaches_g',),
           "efsgd joint sanitiser: C's gradient reaches G unsanitised"),
    Mutant('efsgd.c_path_not_recorded_in_the_ledger', 'dpgen/efsgd/train.py',
           'c_path = self.with_c(it) and not self.joint',
           'c_path = False',
           ('tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[efsgd]',),
           'efsgd per_path: C path released but not recorded in the ledger'),
    Mutant('efsgd.prior_code_reads_private_labels', 'dpgen/efsgd/train.py',
           '    u = g_net.input_code(g_net.sample_z(b, g, dev), y)\n    match',
           '    u = g_net.input_code(g_net.sample_z(b, g, dev), yr[0])\n    match',
           ('tests/test_efsgd_sanitizer.py::test_joint_release_is_the_one_sanitised_weighted_sum_and_all_that_reaches_g[joint_prior]',),
           "efsgd encoder.code=prior: G's reconstruction input carries the private labels (Jacobian leak)"),
    Mutant('efsgd.sound_rule_ignores_c2', 'dpgen/efsgd/sanitizer.py',
           '    return row_sensitivity(clip, clip_error) * noise_multiplier',
           '    return 2.0 * clip * noise_multiplier',
           ('tests/test_efsgd_sanitizer.py::test_error_clip_below_c1_is_rejected',),
           'efsgd sound rule: noise 2*C1*z ignores the error clip C2'),
    Mutant("gswgan.refresh_reads_next_partition", "dpgen/gswgan/train.py",
           "\n    idx = parts.sample(members, b, g)\n",
           "\n    idx = parts.sample((members + 1) % k, b, g)\n",
           ("tests/test_dpac_isolation.py::test_one_record_changes_only_its_own_partitions_states[gswgan_refresh]",),
           "refresh_chunk: D_j's extra critic step reads partition j+1"),
    # -- profiles sized by the target ε (by_eps): a boundary or a size that no longer fits its ε ------------------
    Mutant('by_eps.boundary_strict', 'dpgen/core/config.py',
           'if target <= bound:',
           'if target < bound:',
           ('tests/test_by_eps.py::test_the_smallest_key_at_or_above_eps_applies',),
           'eps=1 gets the settings of the next larger key, not of "eps <= 1"'),
    Mutant('by_eps.gpate_eps1_teachers', 'configs/method/gpate.yaml',
           '${by_eps:{1: 2000, 2: 1000, 5: 600, default: 400}}',
           '${by_eps:{1: 400, 2: 1000, 5: 600, default: 400}}',
           ('tests/test_by_eps.py::test_gpate_quick_profile_meets_each_target_with_its_eps_dependent_sizes',),
           "gpate's eps <= 1 teacher count back to 400: sigma2 far above what 400 votes can beat"),
    # -- the accounting stack (dpgen/privacy: events, accountants, calibrate, budget) ---------------------------
    Mutant("privacy.sigma_eff_least_noisy", "dpgen/privacy/events.py",
           "        return math.fsum(z ** -2 for z in self.noise_multipliers) ** -0.5",
           "        return max(self.noise_multipliers)",
           (LEDGER + "::test_two_gaussians_on_one_batch_vs_pitfall", LEDGER + "::test_sampled_event_groups_releases"),
           "releases on one batch accounted as the least noisy one alone (sigma_eff too large)"),
    Mutant("privacy.rdp_count_ignored", "dpgen/privacy/accountants/rdp.py",
           "        total += e.count * r", "        total += r",
           (LEDGER + "::test_opacus_rdp_oracle",), "an entry's self-composition count left out of the RDP sum"),
    Mutant("privacy.calibrate_liberal_end", "dpgen/privacy/calibrate.py",
           "            lo = mid\n    return hi", "            lo = mid\n    return lo",
           (CALIBRATE + "::test_calibration_oracle_mnist_rdp", CALIBRATE + "::test_calibration_tolerance_and_bounds"),
           "calibration returns the bracket end whose epsilon exceeds the target"),
    Mutant("privacy.guard_ignores_foreign_records", "dpgen/privacy/budget.py",
           "        if self.ledger._version != self._seen_version:", "        if False:",
           (LEDGER + "::test_budget_guard_recomputes_after_foreign_records",),
           "the budget guard keeps its step bound after other releases spent budget"),
    Mutant("privacy.guard_step_unrecorded", "dpgen/privacy/budget.py",
           "        self.ledger._append(LedgerEntry(**self.entry.to_dict()))", "        pass",
           (LEDGER + "::test_budget_guard_stops_exactly_at_target",), "a guarded step is not recorded in the ledger"),
    # -- the Poisson samplers (dpgen/privacy/sampling.py: dpgan, feta, dpaf, the audit's canaries) -----------------
    Mutant("privacy.poisson_batch_complement", "dpgen/privacy/sampling.py",
           "    return (torch.rand(n, generator=g, device=device) < q).nonzero().squeeze(1)",
           "    return (torch.rand(n, generator=g, device=device) >= q).nonzero().squeeze(1)",
           (SAMPLING + "::test_poisson_batch_sizes_are_binomial_and_members_are_the_draws_below_q",),
           "poisson_batch draws the complement of the sample (size n(1-q))"),
    Mutant("privacy.poisson_chunk_complement", "dpgen/privacy/sampling.py",
           "    mask = torch.rand(steps, n, generator=g, device=device) < q",
           "    mask = torch.rand(steps, n, generator=g, device=device) >= q",
           (SAMPLING + "::test_poisson_chunk_sizes_are_binomial_and_members_are_the_draws_below_q",),
           "poisson_chunk draws the complement of the sample (size n(1-q))"),
    Mutant("privacy.poisson_chunk_rate_doubled", "dpgen/privacy/sampling.py",
           "    mask = torch.rand(steps, n, generator=g, device=device) < q",
           "    mask = torch.rand(steps, n, generator=g, device=device) < 2 * q",
           (SAMPLING + "::test_poisson_chunk_sizes_are_binomial_and_members_are_the_draws_below_q",),
           "poisson_chunk samples at twice the rate the ledger accounts"),
    Mutant("privacy.poisson_chunk_non_members", "dpgen/privacy/sampling.py",
           "    order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)",
           "    order = torch.argsort(mask.to(torch.uint8), dim=1, stable=True)",
           (SAMPLING + "::test_poisson_chunk_sizes_are_binomial_and_members_are_the_draws_below_q",),
           "poisson_chunk returns the right number of records, but not the sampled ones"),
    Mutant("privacy.sampler_rate_halved", "dpgen/privacy/sampling.py",
           "        self.n, self.q, self.chunk, self.device = n, float(q), max(1, int(chunk)), device",
           "        self.n, self.q, self.chunk, self.device = n, float(q) / 2, max(1, int(chunk)), device",
           (SAMPLING + "::test_poisson_sampler_sizes_are_binomial_at_its_rate",),
           "PoissonSampler samples at half the rate it is given"),
    Mutant("privacy.sampler_chunks_share_one_fork", "dpgen/privacy/sampling.py",
           "poisson_chunk(self.n, self.q, self.chunk, self.generator.fork(c), self.device))",
           "poisson_chunk(self.n, self.q, self.chunk, self.generator.fork(0), self.device))",
           (SAMPLING + "::test_poisson_sampler_step_s_is_row_s_mod_chunk_of_fork_s_div_chunk",),
           "every chunk of a PoissonSampler replays chunk 0's batches"),
    Mutant("privacy.sampler_one_batch_per_chunk", "dpgen/privacy/sampling.py",
           "        return self._cached[1][step % self.chunk]",
           "        return self._cached[1][0]",
           (SAMPLING + "::test_poisson_sampler_step_s_is_row_s_mod_chunk_of_fork_s_div_chunk",),
           "the steps of a chunk all get its first batch (samples repeated, not independent)"),
    # -- the one-run audit (dpgen/audit): a mechanism without its noise or its clip, caught by measuring ------
    Mutant("audit.confidence_not_split", "dpgen/audit/report.py",
           "    return [1.0 - alpha / 2.0] + [1.0 - alpha / (2.0 * channels)] * int(channels)",
           "    return [float(confidence)] * (int(channels) + 1)",
           ("tests/test_audit.py::test_several_tests_share_the_confidence",),
           "a run with several mechanisms tests each score at the full confidence (the largest is no bound)"),
    Mutant("audit.dpsgd_noise_removed", "dpgen/privacy/optimizer.py",
           "            p.grad = (s + noise).view_as(p)",
           "            p.grad = s.view_as(p)",
           (AUDIT_BELOW + "[dpgan]",), "opacus-based DP-SGD (dpgan, dpaf) releases the clipped sum without noise"),
    Mutant("audit.dpsgd_clip_removed", "dpgen/privacy/optimizer.py",
           "        return (self.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)",
           "        return torch.ones_like(norms)",
           (AUDIT_BELOW + "[dpgan]",), "opacus-based DP-SGD's clipping factors are 1 (dpgan's ghost step, the canaries)"),
    Mutant("audit.feta_noise_removed", "dpgen/feta/dpsgd.py",
           "        p.grad = (s + noise) / expected_batch",
           "        p.grad = s / expected_batch",
           (AUDIT_BELOW + "[dpdm]",), "feta/dpdm DP-SGD releases the clipped sum without noise"),
    Mutant("audit.feta_clip_removed", "dpgen/feta/dpsgd.py",
           "    factor = (clip / norms.clamp_min(1e-12)).clamp(max=1.0)",
           "    factor = torch.ones_like(norms)",
           (AUDIT_BELOW + "[dpdm]",), "feta/dpdm DP-SGD sums per-record gradients unclipped"),
    Mutant("audit.gpate_noise_removed", "dpgen/gpate/aggregate.py",
           'noisy = counts + gaussian_noise(counts.shape, sigma2, generator, device=counts.device, mechanism="GNMax argmax")',
           "noisy = counts.clone()",
           (AUDIT_BELOW + "[gpate]",), "G-PATE's argmax on the vote histogram without noise"),
    Mutant("audit.dpagg_noise_removed", "dpgen/dpaf/mechanisms.py",
           "        released = (total + noise) / scale",
           "        released = total / scale",
           (AUDIT_BELOW + "[dpaf]",), "DPAGG releases the feature sum without noise"),
    Mutant("audit.gswgan_sanitizer_noise_removed", "dpgen/gswgan/sanitizer.py",
           "        release = signal + noise\n",
           "        release = signal\n",
           (AUDIT_BELOW + "[gswgan]",), "the GS-WGAN sanitiser releases the clipped image gradients without noise"),
    Mutant("audit.gswgan_sanitizer_clip_removed", "dpgen/gswgan/sanitizer.py",
           "        clipped = clip_rows(rows, self.clip)",
           "        clipped = rows",
           (AUDIT_BELOW + "[gswgan]",), "the GS-WGAN sanitiser noises the image gradients unclipped"),
    Mutant("audit.efsgd_sanitizer_noise_removed", "dpgen/efsgd/sanitizer.py",
           "        return v + noise\n",
           "        return v\n",
           (AUDIT_BELOW + "[efsgd]",), "the error-feedback sanitiser releases its direction without noise"),
    Mutant("audit.efsgd_sanitizer_clip_removed", "dpgen/efsgd/sanitizer.py",
           "        clipped = clip_rows(flat, self.clip).reshape(g.shape)",
           "        clipped = flat.reshape(g.shape)",
           (AUDIT_BELOW + "[efsgd]",), "the error-feedback sanitiser does not clip the image gradients (C1)"),
    # -- secret randomness (issue 23): a mechanism on a public stream, or secret streams a replay can reproduce ---
    Mutant("secret.dpgan_noise_public", "dpgen/dpgan/train.py",
           'g_sample, g_noise, g_fake = run.secret_rng("sample"), run.secret_rng("noise"), run.rng("fake")',
           'g_sample, g_noise, g_fake = run.secret_rng("sample"), run.rng("noise"), run.rng("fake")',
           (DPGAN_WIRING + "::test_sigma_clip_and_poisson_batch_match_the_ledger",),
           "dpgan's DP-SGD noise drawn from a public (seed-derived) stream"),
    Mutant("secret.feta_poisson_public", "dpgen/feta/train.py",
           '"central": run.secret_rng("central"), "sample": run.secret_rng("sample")',
           '"central": run.secret_rng("central"), "sample": run.rng("sample")',
           (FETA_WIRING + "::test_mechanisms_receive_what_the_ledger_records",),
           "feta's Poisson batches drawn from a public stream"),
    Mutant("secret.dpac_partition_draw_public", "dpgen/gswgan/train.py",
           'self.data_gen, self.noise_gen = run.secret_rng("data"), run.secret_rng("noise")',
           'self.data_gen, self.noise_gen = run.rng("data"), run.secret_rng("noise")',
           ("tests/test_dpac_spy.py::test_spy_sigma_clip_and_partition_reads_match_the_ledger[gswgan]",),
           "the partition k of an iteration (and its batches) drawn from a public stream"),
    Mutant("secret.gpate_gnmax_public", "dpgen/gpate/train.py",
           'fake_gen, proj_gen, noise_gen = run.rng("fake"), run.rng("proj"), run.secret_rng("noise")',
           'fake_gen, proj_gen, noise_gen = run.rng("fake"), run.rng("proj"), run.rng("noise")',
           ("tests/test_gpate_train.py::test_spy_mechanisms_receive_what_the_ledger_records",),
           "G-PATE's GNMax noise drawn from a public stream"),
    Mutant("secret.dpaf_dpagg_public", "dpgen/dpaf/train.py",
           'run.secret_rng("agg"), run.rng("fake")', 'run.rng("agg"), run.rng("fake")', (DPAF_SPY,),
           "DPAGG noise drawn from a public stream"),
    Mutant("secret.helper_unchecked", "dpgen/privacy/randomness.py",
           "    g = require_secret(generator, mechanism)\n    dev = g.device if device is None else device",
           "    g = generator\n    dev = g.device if device is None else device",
           (SECRET + "::test_every_mechanism_refuses_a_public_stream",),
           "the one Gaussian-noise helper accepts a public stream"),
    Mutant("secret.streams_from_public_seed", "dpgen/core/streams.py",
           "g = secret_generator(self.device, derive_seed(self._root, name), self.secure_noise)",
           "g = secret_generator(self.device, derive_seed(self.seed, name), self.secure_noise)",
           (SECRET + "::test_a_fixed_root_reproduces_the_secret_streams_and_nothing_else_does",
            SECRET + "::test_a_replay_of_the_public_config_does_not_reproduce_the_release[dpgan]"),
           "secret streams seeded from the public seed (the bug of issue 23)"),
    Mutant("secret.root_not_from_os_entropy", "dpgen/core/run.py",
           "root = dist.broadcast(secrets.token_hex(32) if noise_seed is None else fixed_root(noise_seed))",
           "root = dist.broadcast(fixed_root(seed) if noise_seed is None else fixed_root(noise_seed))",
           (SECRET + "::test_a_replay_of_the_public_config_does_not_reproduce_the_release[gpate]",),
           "the secret root derived from the public seed"),
    Mutant("secret.streams_replayed_after_resume", "dpgen/core/streams.py",
           "        if self._saved is not None and name in self._saved[kind]:",
           '        if self._saved is not None and name in self._saved[kind] and kind == "public":',
           ("tests/test_resume_streams.py::test_resume_continues_the_secret_streams_on_the_cpu[dpgan-3-overrides0]",),
           "a resumed run's secret streams start again from the root: the noise of the first steps is drawn again"),
    Mutant("secret.secure_noise_one_draw", "dpgen/privacy/randomness.py",
           "        for _ in range(SECURE_DRAWS - 1):", "        for _ in range(0):",
           (SECRET + "::test_secure_noise_has_the_same_mean_and_std",),
           "secure noise sums one draw and divides by 2: std halved"),
    # precision=bf16 (issue 24): the clipping must stay fp32 (a bf16 norm is off by up to 2^-8 relative)
    Mutant("precision.feta_clips_bf16_gradients", "dpgen/feta/dpsgd.py",
           "        per_record = [g.to(a.dtype) for a, g in zip(acc, per_record)]",
           "        per_record = list(per_record)",
           (PRECISION + "::test_feta_clipped_sum_is_fp32_under_bf16",),
           "feta/dpdm clip bf16 per-record gradients in bf16"),
    Mutant("precision.dpsgd_norms_in_bf16", "dpgen/privacy/optimizer.py",
           "                    p.grad_sample = _in_dtype(p.grad_sample, p.dtype)",
           "                    pass",
           (PRECISION + "::test_dp_sgd_batch_clips_every_record_in_fp32_under_bf16",),
           "opacus computes the per-sample norms of bf16 gradients in bf16"),
    # compile=true: Poisson batches padded to buckets; padded rows must add nothing, and no record may be dropped
    Mutant("compile.feta_padded_rows_not_zeroed", "dpgen/feta/dpsgd.py",
           "        factor = factor * weight.to(factor.dtype)  # padded rows: factor 0, their (finite) rows add exactly 0",
           "        pass",
           ("tests/test_compile.py::test_padded_rows_add_exactly_zero_to_the_clipped_sum",
            GHOST + "::test_feta_ghost_padded_rows_add_exactly_zero"),
           "feta/dpdm's padded rows (copies of a record) join the clipped sum (torch.func and ghost backends)"),
    Mutant("compile.dpgan_padded_rows_not_zeroed", "dpgen/dpgan/compiled.py",
           'return F.binary_cross_entropy_with_logits(call(x[None], y[None]), t[None], reduction="sum") * w',
           'return F.binary_cross_entropy_with_logits(call(x[None], y[None]), t[None], reduction="sum")',
           ("tests/test_compile.py::test_dpgan_padded_rows_have_exactly_zero_gradient_and_never_reach_the_optimizer",),
           "dpgan's padded rows get a non-zero per-sample gradient"),
    Mutant("compile.dpgan_padding_reaches_the_optimizer", "dpgen/dpgan/compiled.py",
           "        return [g[:rows] for g in grads], loss",
           "        return grads, loss",
           ("tests/test_compile.py::test_dpgan_padded_rows_have_exactly_zero_gradient_and_never_reach_the_optimizer",),
           "dpgan's padded rows handed to opacus as per-sample gradients"),
    # grad_backend=ghost (dpgen/privacy/ghost.py): ghost norms and book-keeping must give the per-record norms and the
    # clipped sum of today's per-record gradients
    Mutant("ghost.cross_terms_dropped", "dpgen/privacy/ghost.py",
           "    return (a_gram * g_gram).sum((1, 2))",
           "    return (a_gram * g_gram).diagonal(dim1=1, dim2=2).sum(1)",
           (GHOST + "::test_every_layer_type_gives_torch_funcs_norms_and_clipped_sum",
            GHOST + "::test_dpgan_discriminator_and_feta_unet_under_the_default_rule"),
           "the ghost norm without its cross terms t != t' (the sum of the positions' squared norms)"),
    Mutant("ghost.one_layer_norm", "dpgen/privacy/ghost.py",
           "            sq = torch.stack([part.sq for _, part in parts]).sum(0) if parts else \\",
           "            sq = parts[0][1].sq if parts else \\",
           (GHOST + "::test_dpgan_discriminator_and_feta_unet_under_the_default_rule",
            GHOST + "::test_dpgan_ghost_clips_every_sample_to_c"),
           "the clipping factor from one parameter's norm, not the norm over all parameters"),
    Mutant("ghost.rows_clipped_apart", "dpgen/privacy/ghost.py",
           "        records = losses.shape[0]",
           "        records = calls[self.layers[0]][0][0].shape[0]",
           (GHOST + "::test_every_layer_type_gives_torch_funcs_norms_and_clipped_sum",
            GHOST + "::test_feta_ghost_step_equals_torch_func"),
           "each of a record's K rows clipped apart (K-average after clipping)"),
    Mutant("ghost.bookkeeping_unclipped", "dpgen/privacy/ghost.py",
           "    return (t.reshape(records, -1, *t.shape[1:]) * c.reshape(-1, *([1] * t.dim()))).reshape(t.shape)",
           "    return t",
           (GHOST + "::test_every_layer_type_gives_torch_funcs_norms_and_clipped_sum",
            GHOST + "::test_dpgan_ghost_step_equals_opacus_hooks"),
           "a ghost convolution's book-keeping product without the clipping factors"),
    Mutant("ghost.linear_bookkeeping_unclipped", "dpgen/privacy/ghost.py",
           "                return torch.mm((g * c[:, None, None]).flatten(0, 1).t(), a.flatten(0, 1))",
           "                return torch.mm(g.flatten(0, 1).t(), a.flatten(0, 1))",
           (GHOST + "::test_every_layer_type_gives_torch_funcs_norms_and_clipped_sum",),
           "a ghost Linear layer's book-keeping product without the clipping factors"),
    Mutant("ghost.materialised_unclipped", "dpgen/privacy/ghost.py",
           "lambda c: (c @ flat).reshape(per_record.shape[1:]))",
           "lambda c: flat.sum(0).reshape(per_record.shape[1:]))",
           (GHOST + "::test_every_layer_type_gives_torch_funcs_norms_and_clipped_sum",
            GHOST + "::test_feta_ghost_step_equals_torch_func"),
           "a materialised layer's per-record gradients summed unclipped"),
    Mutant("ghost.buffer_borders_not_zero", "dpgen/privacy/ghost.py",
           "                buf = self._scratch[key] = torch.zeros(shape, device=device)",
           "                buf = self._scratch[key] = torch.ones(shape, device=device)",
           (GHOST + "::test_every_layer_type_gives_torch_funcs_norms_and_clipped_sum",
            GHOST + "::test_a_clippers_reused_buffers_carry_nothing_from_one_batch_to_the_next"),
           "a convolution's padded input buffer made without zero borders (the patches see a frame of ones)"),
    Mutant("ghost.stale_buffers_summed", "dpgen/privacy/ghost.py",
           "        return Recorded(sq, losses.detach(), parts, self.params, lambda: self._batches == batch)",
           "        return Recorded(sq, losses.detach(), parts, self.params, lambda: True)",
           (GHOST + "::test_clipped_sum_refuses_a_batch_whose_buffers_a_later_batch_reused",),
           "a batch's clipped sum taken after a later batch overwrote its per-record gradients in the shared buffers"),
    # dpgen's CPU kernel (dpgen/privacy/ghost_kernel.cpp and ghost.py's FUSED path): every patch value and every
    # output column in the norm and the per-record gradient, a layer's calls summed before the norm, and clipped
    Mutant("ghost.fused_calls_normed_apart", "dpgen/privacy/ghost.py",
           "            got += [total, torch.linalg.vector_norm(total.flatten(1), dim=1).square()]",
           "            got += [total, _total(c[i + 1] for c in per_call)]",
           (GHOST + "::test_every_layer_type_gives_torch_funcs_norms_and_clipped_sum",),
           "a layer called twice: the kernel's per-call norms added instead of the norm of the calls' summed gradient"),
    Mutant("ghost.fused_unclipped", "dpgen/privacy/ghost.py",
           "        return (c @ got[0].flatten(1)).reshape(d, op)[:, :p].t().reshape(m.weight.shape)",
           "        return got[0].flatten(1).sum(0).reshape(d, op)[:, :p].t().reshape(m.weight.shape)",
           (GHOST + "::test_every_layer_type_gives_torch_funcs_norms_and_clipped_sum",
            GHOST + "::test_the_default_rule_runs_the_kernel_and_dpgans_step_matches_the_plain_path"),
           "the kernel's per-record gradients summed without the clipping factors"),
    Mutant("ghost.fused_bias_unclipped", "dpgen/privacy/ghost.py",
           "        out.append((m.bias, _Part(got[3], lambda c: (c @ got[2])[:p])))",
           "        out.append((m.bias, _Part(got[3], lambda c: got[2].sum(0)[:p])))",
           (GHOST + "::test_every_layer_type_gives_torch_funcs_norms_and_clipped_sum",
            GHOST + "::test_the_default_rule_runs_the_kernel_and_dpgans_step_matches_the_plain_path"),
           "the kernel's per-record bias gradients summed without the clipping factors"),
    Mutant("ghost.kernel_bias_last_position_dropped", "dpgen/privacy/ghost_kernel.cpp",
           "        for (int64_t t = 0; t < T; ++t)\n          for (int64_t o = 0; o < Op; ++o) b[o] += gl[t * Op + o];",
           "        for (int64_t t = 0; t + 1 < T; ++t)\n          for (int64_t o = 0; o < Op; ++o) b[o] += gl[t * Op + o];",
           (GHOST + "::test_every_layer_type_gives_torch_funcs_norms_and_clipped_sum",
            GHOST + "::test_the_default_rule_runs_the_kernel_and_dpgans_step_matches_the_plain_path"),
           "the kernel's bias gradient leaves out a record's last position (from its norm and its clipped sum)"),
    Mutant("ghost.kernel_last_values_dropped", "dpgen/privacy/ghost_kernel.cpp",
           "  for (; d < D; ++d) total += block<1, NV>(x, base, T, g, og, off + d, out + d * oo, oo);",
           "  for (; d + 1 < D; ++d) total += block<1, NV>(x, base, T, g, og, off + d, out + d * oo, oo);",
           (GHOST + "::test_every_layer_type_gives_torch_funcs_norms_and_clipped_sum",
            GHOST + "::test_the_default_rule_runs_the_kernel_and_dpgans_step_matches_the_plain_path"),
           "the kernel leaves out a weight's last patch value (D not a multiple of its block) from norm and gradient"),
    Mutant("ghost.kernel_last_outputs_dropped", "dpgen/privacy/ghost_kernel.cpp",
           "      if (rest == 1) total += columns<1>(",
           "      if (rest == 9) total += columns<1>(",
           (GHOST + "::test_every_layer_type_gives_torch_funcs_norms_and_clipped_sum",),
           "the kernel leaves out the outputs past the last full vector of 64 (80 outputs: 16 of them)"),
    Mutant("ghost.kernel_padding_not_zero", "dpgen/privacy/ghost_kernel.cpp",
           "    std::vector<float> xl(K * C * Hp * Wp, 0.f), gl(T * Op, 0.f);",
           "    std::vector<float> xl(K * C * Hp * Wp, 1.f), gl(T * Op, 0.f);",
           (GHOST + "::test_every_layer_type_gives_torch_funcs_norms_and_clipped_sum",
            GHOST + "::test_the_default_rule_runs_the_kernel_and_dpgans_step_matches_the_plain_path"),
           "the kernel's padded input with a border of ones instead of zeros"),
    Mutant("ghost.kernel_off", "dpgen/privacy/ghost.py",
           "    return FUSED if isinstance(m, nn.Conv2d) else plain_strategy(m, rows, positions, d, p)",
           "    return plain_strategy(m, rows, positions, d, p)",
           (GHOST + "::test_the_default_rule_runs_the_kernel_and_dpgans_step_matches_the_plain_path",),
           "not a privacy bug, a wiring one: the default rule never reaches the kernel (its tests then test nothing)"),
    Mutant("ghost.dpgan_unclipped", "dpgen/privacy/optimizer.py",
           "        by_param = dict(zip(map(id, rec.params), rec.clipped_sum(self.clip_factors(rec.norms))))",
           "        by_param = dict(zip(map(id, rec.params), rec.clipped_sum(torch.ones_like(rec.norms))))",
           (GHOST + "::test_dpgan_ghost_clips_every_sample_to_c", GHOST + "::test_dpgan_ghost_step_equals_opacus_hooks"),
           "dpgan's ghost step sums the samples' gradients unclipped"),
    Mutant("audit.dpsgd_canaries_unclipped", "dpgen/privacy/optimizer.py",
           "coords.summed_grad.add_(self.canaries.clipped_sum(self.clip_factors).to(coords.summed_grad.dtype))",
           "coords.summed_grad.add_(self.canaries.clipped_sum(torch.ones_like).to(coords.summed_grad.dtype))",
           ("tests/test_audit_dpsgd.py::test_dpsgd_canaries_are_clipped_to_c_on_their_coordinates_and_leave_the_model_alone",),
           "the DP-SGD optimizer adds an audit's canary rows unclipped"),
    Mutant("graph.replay_stale_inputs", "dpgen/core/graph.py",
           "            static.copy_(a)",
           "            static.copy_(static)",
           ("tests/test_graph.py::test_replays_compute_every_call_from_its_own_inputs",
            "tests/test_graph.py::test_captured_feta_step_equals_the_eager_one_over_poisson_batches"),
           "a replayed micro-batch step computes on the captured micro-batch's records and draws, not on its own"),
    Mutant("graph.padded_rows_counted", "dpgen/feta/dpsgd.py",
           "        padded, weight = pad_rows(batch, size)",
           "        padded, weight = pad_rows(batch, size)\n        weight = torch.ones_like(weight)",
           ("tests/test_graph.py::test_captured_feta_step_equals_the_eager_one_over_poisson_batches",),
           "the captured step's padding rows (copies of the first record) counted: that record adds up to (1+pads)·C"),
    Mutant("feta.ranks_keep_their_own_micro_batch", "dpgen/feta/train.py",
           "    micro = run.dist.min(micro)",
           "    micro = micro",
           (FETA_WIRING + "::test_the_micro_batch_passes_through_the_ranks_agreement",),
           "each rank keeps the micro-batch it measured: ranks that split by index could count a record twice"),
    Mutant("gswgan.ranks_keep_their_own_chunk", "dpgen/gswgan/train.py",
           "    chunk = dist.min(max(1, min(k, fit)))",
           "    chunk = max(1, min(k, fit))",
           ("tests/test_gswgan_chunk.py::test_the_ranks_take_the_least_chunk",),
           "not a privacy bug, a consistency one: ranks with their own measured chunk size shard other chunks"),
    Mutant("compile.bucket_drops_records", "dpgen/core/compile.py",
           "    if cap is not None and rows <= int(cap) < size:",
           "    if cap is not None and int(cap) < size:",
           ("tests/test_compile.py::test_a_bucket_is_never_smaller_than_the_batch_and_the_buckets_are_few",),
           "a bucket (the micro-batch cap) smaller than the Poisson rows it must hold"),
    # -- the one-run audit (issue 50): a mechanism with half the noise its ledger records, caught by measuring ----
    Mutant("audit.dpgan_noise_half", "dpgen/dpgan/train.py",
           "noise_multiplier=sigma, max_grad_norm=float(hp.clip),",
           "noise_multiplier=sigma * 0.5, max_grad_norm=float(hp.clip),",
           (AUDIT_BELOW + "[dpgan]",), "DP-SGD (dpgan) with half the noise std its ledger records"),
    Mutant("audit.gswgan_sanitizer_noise_half", "dpgen/gswgan/sanitizer.py",
           "noise = gaussian_noise(signal.shape, self.noise_std, self.generator,",
           "noise = gaussian_noise(signal.shape, self.noise_std * 0.5, self.generator,",
           (AUDIT_BELOW + "[gswgan-wide]",), "the GS-WGAN sanitiser with half the noise std its ledger records"),
    Mutant("audit.gpate_noise_half", "dpgen/gpate/aggregate.py",
           'noisy = counts + gaussian_noise(counts.shape, sigma2, generator, device=counts.device, mechanism="GNMax argmax")',
           'noisy = counts + gaussian_noise(counts.shape, sigma2 * 0.5, generator, device=counts.device, mechanism="GNMax argmax")',
           (AUDIT_BELOW + "[gpate]",), "Confident-GNMax's argmax with half the noise std its ledger records"),
    Mutant("audit.dpagg_noise_half", "dpgen/dpaf/train.py",
           'real_aggs = [dpagg(d_net.features(x_all[s], y_all[s], eps_sin), sens, z3, bsz, g_agg, agg_canaries, j)',
           'real_aggs = [dpagg(d_net.features(x_all[s], y_all[s], eps_sin), sens, z3 * 0.5, bsz, g_agg, agg_canaries, j)',
           (AUDIT_BELOW + "[dpaf-dpagg]",), "DPAGG with half the noise std its ledger records"),
]


def _copy_tree(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


def check_applies(m: Mutant, tree: Path) -> str | None:
    """None if ``m`` applies to ``tree`` exactly once, else why not."""
    text = (tree / m.file).read_text()
    count = text.count(m.original)
    return None if count == 1 else f"original line found {count} times in {m.file}"


#: a pytest-timeout failure (its ``timeout`` ini option, or a test's ``timeout`` mark): a hang, not a detection
_TIMEOUT_FAILURE = re.compile(r"^Failed: Timeout")


def classify(rc: int, junit: str | None) -> str:
    """The verdict on one mutant's test run, from pytest's exit status and its JUnit XML report.

    'killed' only when pytest ran the named tests and at least one FAILED (an assertion, or an exception in
    the test's body). A collection error (the mutant broke an import: SyntaxError, NameError at import), a
    fixture's setup or teardown error and a test stopped by pytest-timeout are no detection: they are
    'error: ...' and 'timeout: ...', which fail the gate like a survivor, saying what happened."""
    if rc == 0:
        return "survived"
    if rc == 5:
        return "stale: pytest collected no test (test ids?)"
    if rc == 4:
        return "error: pytest usage error (a test id not found, or conftest.py failed to import)"
    if rc == 3:
        return "error: pytest internal error"
    if junit is None:
        return f"error: pytest exit {rc} without a report"
    failed, timeouts, errors = [], [], []
    for case in ElementTree.fromstring(junit).iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}".lstrip(":")
        for el in case:
            message = (el.get("message") or "").strip().splitlines()
            message = message[0][:120] if message else ""
            if el.tag == "error":
                errors.append(f"{name}: {message}")
            elif el.tag == "failure":
                (timeouts if _TIMEOUT_FAILURE.match(message) else failed).append(f"{name}: {message}")
    collection = [e for e in errors if "collection failure" in e]
    if collection:
        return f"error: collection failed ({collection[0]})"
    if failed:
        return "killed"
    if timeouts:
        return f"timeout: {timeouts[0]}"
    if errors:
        return f"error: {errors[0]}"
    return f"error: pytest exit {rc} and no failed test in its report"


def run_mutant(m: Mutant, tree: Path, timeout: int) -> tuple[str, float]:
    """The verdict on ``m`` (:func:`classify`, or 'stale: ...' / 'timeout: ...') and the seconds its tests took."""
    path = tree / m.file
    text = path.read_text()
    why = check_applies(m, tree)
    if why:
        return f"stale: {why}", 0.0
    path.write_text(text.replace(m.original, m.mutant))
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="dpgen-mutant-report-") as tmp:
        report = Path(tmp) / "junit.xml"
        try:
            res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                                  f"--junitxml={report}", "-m", "slow or not slow", *m.tests], cwd=tree, env=env,
                                 capture_output=True, text=True, timeout=timeout)
            verdict = classify(res.returncode, report.read_text() if report.is_file() else None)
        except subprocess.TimeoutExpired:
            verdict = f"timeout: its tests ran past {timeout} s"
        finally:
            path.write_text(text)
    return verdict, time.time() - t0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix", nargs="*", help="only mutants whose id starts with one of these")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per mutant's test run")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.prefix or m.id.startswith(tuple(args.prefix))]
    if args.list:
        for m in chosen:
            print(f"{m.id:32s} {m.file}: {m.why}")
        return 0
    if not chosen:
        print("no mutant matches", file=sys.stderr)
        return 2
    t_all = time.time()
    failures = []
    with tempfile.TemporaryDirectory(prefix="dpgen-mutants-") as tmp:
        tree = Path(tmp)
        _copy_tree(tree)
        for m in chosen:
            verdict, seconds = run_mutant(m, tree, args.timeout)
            print(f"{verdict:18s} {seconds:7.1f}s  {m.id}  ({m.why})", flush=True)
            if verdict != "killed":
                failures.append(m.id)
    print(f"{len(chosen) - len(failures)}/{len(chosen)} mutants killed in {time.time() - t_all:.0f}s")
    if failures:
        print("not killed: " + ", ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
