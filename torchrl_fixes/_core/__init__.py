"""The patching framework: what a fix is, how it is applied and removed, and how stock code is told.

Nothing here knows a fix or imports TorchRL. The modules, leaves first:

- :mod:`~torchrl_fixes._core.errors`: :class:`TargetChanged`;
- :mod:`~torchrl_fixes._core.warning_categories`: the package's warnings;
- :mod:`~torchrl_fixes._core.versions`: the installed version of a distribution;
- :mod:`~torchrl_fixes._core.source_fingerprint`: a function's code, as a short hash;
- :mod:`~torchrl_fixes._core.patching`: replacing attributes, all or none, originals kept;
- :mod:`~torchrl_fixes._core.registry`: :class:`Fix`, the fingerprint gate and the
  :class:`Registry` that applies, removes and reports the fixes.

The fixes (:mod:`torchrl_fixes.fixes`) use these; the tools use both.
"""
