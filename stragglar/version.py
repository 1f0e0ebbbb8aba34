"""The package version, in a module of its own so that every layer can name it in metadata.

Generators stamp it into the schedules they make; importing it from the package root would tie
the lowest layer to the top one.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
