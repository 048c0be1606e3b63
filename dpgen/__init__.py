"""dpgen: differentially private image synthesis, five papers in one package."""

__version__ = "0.1.0"
