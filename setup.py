"""The one thing pyproject.toml cannot say: configs/ (at the repository's top level) ships as
`cipr.configs`."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["cipr*"]), "cipr.configs"], package_dir={"cipr.configs": "configs"})
