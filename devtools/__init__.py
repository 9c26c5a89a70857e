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
  upstream series, ``patches/main/``, rendered from the runtime fixes, ``upstream/``
  and each pull request's text (``patches/main/NNNN-name.md``) onto a copy of the
  installed TorchRL (``--check`` lists the patches that are out of date); and a copy of
  the installed TorchRL with the series applied, whose command prints the untouched
  install's path;
- ``upstream-review`` (:mod:`devtools.upstream_review`): the ``patches/main/``
  series reviewed one pull request at a time as TorchRL's CI would, with upstream's
  pinned hooks (:mod:`devtools.review_hooks`) and each PR's tests before and after
  it (:mod:`devtools.review_pytest`);
- ``tree-speed`` (:mod:`devtools.tree_speed`): this checkout's slice sample against
  another checkout's, each as a ratio to a ``RandomSampler`` floor timed in the same
  process, processes alternating between the two trees;
- ``index-structures`` (:mod:`devtools.index_structures`): the trajectory index's
  sorted key store against a flat sorted array and a blocked one, on the same calls;
- ``gpu`` (:mod:`devtools.gpu_check`): the whole GPU check in one run, written to one
  report: ``pytest -m cuda``, stock against patched on a GPU storage, ``use_gpu`` over a
  CPU storage and TD-MPC2's buffer on the GPU, host synchronisations, ``compare`` and
  ``diagnose``; ``--device cpu`` is its dry run (``docs/gpu.md``);
- :mod:`devtools.torchrl_suite`, a pytest plugin (``-p devtools.torchrl_suite``) that
  applies the fixes before TorchRL's own test suite imports TorchRL, and
  :mod:`devtools.compare_junit`, which lists the tests that pass on stock and not with
  the fixes (``devtools/run_torchrl_suite.sh`` runs both);
- :mod:`devtools.python_floor` (``python -m devtools.python_floor PATH...``), which
  reports the uses of Python newer than 3.10 that vermin does not (``nox -s lint``).
"""
