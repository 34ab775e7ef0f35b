"""agl-verl: verl-based algorithm backends and inference engines for agl."""

__version__ = "0.1.0"
