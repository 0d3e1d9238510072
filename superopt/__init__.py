"""superopt: a tensor-algebra superoptimizer (see README.md and DESIGN.md)."""

__version__ = "0.1.0"
__all__ = ["__version__"]
