"""The connector's version, in a module of its own so that every module can name it."""

__version__ = "0.1.0"
