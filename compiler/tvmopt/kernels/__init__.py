"""Kernels without search: default CPU schedule rules and library dispatch.

* `layout`: Relax rewrites the kernels rely on (Clip lifted back to ops, NHWC convolutions).
* `cpu`: dlight-style schedule rules for CPU contractions (conv2d, dense/matmul/batch_matmul,
  pooling) and elementwise kernels: register tiles, parallel outer loops, vectorized inner.
* `onednn`: conv2d / matmul chains offloaded to oneDNN through a tvm-ffi extension, called
  from the Relax VM with `R.call_dps_packed`.
* `dispatch`: which of these each heavy kernel gets, chosen by a short timing, cached.
"""
