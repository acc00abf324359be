"""The command lines: ``torchring run`` (its flags, their modes, the config file, the tuning flags,
``--check-build``) and ``horovodrun``. The top of the launcher: it builds a ``RunConfig`` and hands it to
``launch.job``."""
