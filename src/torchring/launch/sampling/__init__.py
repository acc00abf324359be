"""Reading a running process from outside: its Python stack (the stack hook a local rank loads through
``sitecustomize``, and the probe that asks for a dump), its flight record (``flight_report``) and its state
in ``/proc``. Imports only the leaf modules; spawning and watching build on it."""
