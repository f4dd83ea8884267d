"""oneDNN as a kernel library: fp32/bf16 convolution, matmul, batch-matmul and attention chains,
a QDQ model's int8 ones, dynamically quantized integer matmuls and convolutions, and whole
LSTM / GRU / RNN nodes.

The modules, in the order a module goes through them:

* `extension`: build `onednn_ext.cc` into a tvm-ffi library and load it (the calling
  convention both sides share).
* `int8`: a QDQ model's int8 weights, noted before constant folding (`record_qdq_weights`).
* `patterns`, `int8_patterns`, `checks`: the chains oneDNN takes, and the checks a pattern
  cannot express.
* `partition`: group each chain into a composite function; `workload_key` names it.
* `lower`, `int8_lower`, `attention`: composites -> `R.call_dps_packed` calls.
* `recurrent`: whole recurrent nodes on the RNN primitive.

What the rest of tvmopt uses is re-exported here.
"""

from .extension import (ATTN_FUNC, BMM_FUNC, COMPUTE, CONV_FUNC, INT8_FEATURES, LAYOUT_AUTO,
                        LAYOUT_PLAIN, MATMUL_FUNC, QCONV_FUNC, QDQ_WEIGHTS_ATTR, QMATMUL_FUNC,
                        build_extension, extension_id, find_onednn, load_extension,
                        load_library, share_pool)
from .int8 import (RecordQDQWeights, has_integer_conv, has_integer_matmul, int8_unavailable,
                   record_qdq_weights, strip_qdq_weights)
from .lower import dispatch_onednn, lower
from .partition import composites, is_conv, is_dynamic, is_quantized, partition, workload_key
from .recurrent import (RNN_FUNC, lower_recurrent, recurrent_sites, recurrent_unsupported,
                        recurrent_workload_key)

__all__ = [
    "ATTN_FUNC", "BMM_FUNC", "COMPUTE", "CONV_FUNC", "INT8_FEATURES", "LAYOUT_AUTO",
    "LAYOUT_PLAIN", "MATMUL_FUNC", "QCONV_FUNC", "QDQ_WEIGHTS_ATTR", "QMATMUL_FUNC", "RNN_FUNC",
    "RecordQDQWeights", "build_extension", "composites", "dispatch_onednn", "extension_id",
    "find_onednn", "has_integer_conv", "has_integer_matmul", "int8_unavailable", "is_conv",
    "is_dynamic", "is_quantized", "load_extension", "load_library", "lower", "lower_recurrent",
    "partition", "record_qdq_weights", "recurrent_sites", "recurrent_unsupported",
    "recurrent_workload_key", "share_pool", "strip_qdq_weights", "workload_key",
]
