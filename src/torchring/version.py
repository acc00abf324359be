"""The torchring release number."""

__version__ = "0.1.0"
