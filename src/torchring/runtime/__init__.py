"""The runtime under the public API: one engine per rank that negotiates named requests and runs them on
c10d process groups.

Layers, lowest first (a module may import only from its own layer or lower ones; ``tests/unit/
test_layers.py`` enforces it, imports inside functions included): ``requests`` (the vocabulary: requests,
their metadata, the completion ``Handle``), ``observe/`` (timeline, flight recorder), ``coordination/``
(what every rank agrees on before data moves), ``dataplane/`` (moving the data once agreed), ``engine``
(the background thread that runs one cycle of each), ``context`` (``init()``/``shutdown()`` and the state
of one initialised runtime), ``submit`` (building requests and handing them to the engine). Below the
runtime: the leaf modules (``contract``, ``settings``, ``exceptions``, ...), ``environments`` and
``metrics``; above it: the public API."""
