"""ONNX in: loading and checking models, the Relax importer, model info, op converters and
the carriers of 8/4/2-bit types."""
