"""Development tooling of the torchrl-fixes repository; not part of the installed package.

``import torchrl_fixes`` needs none of this. These modules work in a clone of the
repository, beside the conformance suite (``conformance/``) and the upstream diffs
(``patches/``), and are run as ``python -m devtools <command>`` from its root:

- ``bench`` (:mod:`devtools.speed_comparison`): stock against patched TorchRL timed
  on this machine, with the suite's speed benchmarks; a table, a plot and the raw
  ``bench.json``;
- ``tdmpc2`` (:mod:`devtools.tdmpc2_loop`): TD-MPC2's replay buffer, stock against
  patched, on the installed TorchRL (``nox -s benchmark_tdmpc2`` runs it on the
  release TD-MPC2 pins);
- ``compare`` (:mod:`devtools.pinned_sample_report`): what stock and patched
  ``pin_memory=True`` buffers return, side by side;
- ``export-patches`` and ``patched-copy`` (:mod:`devtools.upstream_patches`): the
  upstream diffs written from the runtime fixes, and a copy of the installed TorchRL
  with them applied;
- ``upstream-review`` (:mod:`devtools.upstream_review`): the ``patches/main/``
  series reviewed one pull request at a time as TorchRL's CI would, with upstream's
  pinned hooks (:mod:`devtools.review_hooks`) and each PR's tests before and after
  it (:mod:`devtools.review_pytest`);
- :mod:`devtools.torchrl_suite`, a pytest plugin (``-p devtools.torchrl_suite``) that
  applies the fixes before TorchRL's own test suite imports TorchRL, and
  :mod:`devtools.compare_junit`, which lists the tests that pass on stock and not with
  the fixes (``devtools/run_torchrl_suite.sh`` runs both);
- :mod:`devtools.python_floor` (``python -m devtools.python_floor PATH...``), which
  reports the uses of Python newer than 3.10 that vermin does not (``nox -s lint``).
"""
