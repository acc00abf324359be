"""Moving the data once the ranks agreed: the executor (one c10d call per negotiated response, fused when
the plan says so), the one reduction path (``reduce``: scaling, averaging, the c10d allreduce), completion
of handles, the process-set table and its data groups, and the gradient lane (the optimizer's bucketed
allreduces that run without negotiation once the ranks voted them safe) with its registry. May import
``runtime.coordination`` (the negotiated responses, the deadlock watch), ``runtime.observe`` and lower;
never the engine, the context or the public API."""
