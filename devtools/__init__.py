"""Developer tools for torchrl-fixes; not part of the installed package."""
