"""Hydra configs, shipped in the wheel as `cipr.configs` (setup.py maps this folder)."""
