"""Artifacts at run time: the folder format, loading and running, verification against
onnxruntime, and building a module to run in memory."""
