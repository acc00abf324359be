"""Diagnostics: tools that look at an environment or a run and say what is wrong (e.g. ``torchring doctor``)."""
