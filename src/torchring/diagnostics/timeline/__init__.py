"""``torchring timeline``: reading a timeline file (``trace``), summarising it (``summary``), the report
and the command line."""
