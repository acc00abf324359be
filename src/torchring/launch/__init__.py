"""``torchring run``: parse the command line, assign ranks to hosts, start and supervise the workers.

Layers, lowest first (enforced by ``tests/unit/test_layers.py``): ``hosts`` and ``rendezvous`` (host lists,
the job's store server), ``sampling/`` (reading a process's stack and flight record), ``spawn/`` (starting
processes locally, over SSH, in containers; the one worker record), ``watch/`` (hang detection, its
reports, stragglers, ``torchring dump``), ``supervisor`` (a fixed job's failure policy) and ``elastic/``
(the elastic driver), ``job`` (the one job scaffold for both), ``function_job`` (``torchring.run``), and
``cli/`` (the command lines) on top. Nothing here is imported by a rank."""
