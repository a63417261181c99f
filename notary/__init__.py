"""notary: a certificate notary server (Convergence, Perspectives, v2) on Trio."""

__version__ = "0.1.0"
