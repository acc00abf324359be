"""What a rank records about its own work, for people: the timeline (``HOROVOD_TIMELINE``), the flight
recorder (the last operations, read by the launcher's hang reports and ``torchring dump``) and the engine
thread's CPU time. It imports only ``runtime.requests`` and the leaf modules, so every layer above may
record."""
