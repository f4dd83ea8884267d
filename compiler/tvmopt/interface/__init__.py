"""ONNX file -> artifact: the compile API and the accuracy report of non-fp32 builds."""
