"""The elastic job's driver and its parts: settings and membership records, host discovery and the
blacklist, the failure policy, the pool of usable hosts, the membership plan (pure) and the recovery clock.
May import ``launch.watch``, ``launch.spawn`` and lower; the worker side is ``torchring.elastic``."""
