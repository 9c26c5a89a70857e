"""The errors of the patching framework: a leaf module, so that every other one can import it."""
from __future__ import annotations


class TargetChanged(Exception):
    """A fix's target is missing or no longer looks like the code the fix replaces."""
