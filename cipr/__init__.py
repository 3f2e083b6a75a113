"""CIPR: Cross-Interface Policy Regularization for tool-calling agents."""

__version__ = "0.1.0"
