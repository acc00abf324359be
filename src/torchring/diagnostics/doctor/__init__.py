"""``torchring doctor``: checks of this host and of remote hosts (``checks``, the per-host ``probe`` run
there), their rendering, and the command line."""
