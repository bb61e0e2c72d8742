"""raydra: Hydra-composed experiments trained on Ray Train workers with Lightning."""

__version__ = "0.1.0"
