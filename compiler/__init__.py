"""tvmopt: a compiler-based optimization pipeline for ML models on Apache TVM (Relax)."""

__version__ = "0.1.0"
