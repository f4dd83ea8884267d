"""Kernel libraries the pipeline hands whole chains to, instead of generating code for them.

* `onednn`: convolutions, matmuls, attention, int8 and recurrent layers on oneDNN's primitives,
  called from the Relax VM through a tvm-ffi extension (`R.call_dps_packed`).

Which kernels go to a library, and in which precision, is decided by timing them on the host
(`precision.choice`); this package only says what a library can take and how to call it.
"""
