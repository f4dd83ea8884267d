"""`tvmopt compare`: why one model (a "lightweight" variant, another precision) is slower than
another on a target, in named causes that add up to the measured difference, and what to ship.

`causes` classifies kernels (onnxruntime nodes, tvmopt fused kernels) into causes; `attribution`
turns two per-kernel profiles and two measured medians into per-cause deltas (pure arithmetic);
`rewrite` builds the ONNX variants worth measuring (dynamic quantization folded back to fp32);
`recommend` ranks what to ship; `run` measures and profiles; `report` prints and plots.
"""
