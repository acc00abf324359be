"""What the ranks agree on before any data moves: the control channel and its Gloo implementation, the
announcement each rank sends per cycle (``messages``), the engine's settings (``engine_settings``), the
negotiation of named requests and its consistency checks, the response cache, the fusion plan, the stall
inspector, the deadlock watch, the idle wake-up and the topology exchange. Pure where it can be
(negotiation, response cache, fusion are tested without process groups). May import ``runtime.observe``,
``runtime.requests``, ``environments``, ``metrics`` and the leaf modules; never the data plane or the
engine."""
