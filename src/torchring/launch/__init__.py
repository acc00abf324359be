"""``torchring run``: parse the command line, assign ranks to hosts, start and supervise the workers."""
