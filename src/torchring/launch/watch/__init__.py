"""Watching a running job for hangs: the hang detector (no rank's stack changed for ``--hang-timeout``),
its report of where every rank is, the straggler gauges, ``torchring dump`` and the hints for known
errors. May import ``launch.spawn``, ``launch.sampling`` and lower."""
