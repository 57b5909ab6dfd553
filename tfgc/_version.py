"""The package version, read by pyproject.toml (setuptools dynamic metadata) and tfgc."""
__version__ = "0.1.0"
