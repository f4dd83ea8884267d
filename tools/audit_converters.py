"""Audit the ONNX converters: which attributes and optional inputs they never read.

Two views, both printed:
  static   for each op the converter map handles, the attributes the ONNX schema defines (at the
           newest opset) whose name never appears in the converter's source (tvmopt's module, and
           TVM's converter where tvmopt falls back to it). A candidate list: a converter may
           read an attribute through a helper, so each entry is checked by the dynamic view.
  dynamic  every ONNX node conformance case imported (no build) through tvmopt's importer,
           which refuses an attribute set to a non-default value or a given optional input
           that the converter did not read (frontend/importer.py); the refusals are listed.

Usage:
  python tools/audit_converters.py [--static-only] [--const-operands]
"""

from __future__ import annotations

import argparse
import collections
import inspect
import os
import re
import sys
import tempfile
import warnings


def static_view() -> dict[str, list[str]]:
    import onnx.defs
    from tvm.relax.frontend.onnx import onnx_frontend

    from tvmopt.frontend.onnx_ops import converter_map, tvmopt_converters

    tvm_map = onnx_frontend._get_convert_map()
    ours = tvmopt_converters()

    def source(entry) -> str:
        obj = getattr(entry, "fn", entry)
        try:
            text = inspect.getsource(obj)
        except (OSError, TypeError):
            return ""
        if isinstance(obj, type):
            for base in obj.__mro__[1:]:
                if base.__module__.startswith(("tvm", "tvmopt")):
                    try:
                        text += inspect.getsource(base)
                    except (OSError, TypeError):
                        pass
        return text

    found = {}
    for op, entry in sorted(converter_map().items()):
        if not onnx.defs.has(op):
            continue
        schema = onnx.defs.get_schema(op, onnx.defs.onnx_opset_version())
        text = source(entry)
        if op in ours:
            text += inspect.getsource(sys.modules[getattr(entry, "fn", entry).__module__])
            if "tvm_converter" in text and op in tvm_map:
                text += source(tvm_map[op])
        missing = [a for a in sorted(schema.attributes)
                   if not re.search(r"[\"']%s[\"']" % re.escape(a), text)]
        if missing:
            found[op] = missing
    return found


def dynamic_view(const_operands: bool) -> collections.Counter:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tools.onnx_conformance import collect
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.frontend.onnx_model import load_onnx

    refusals: collections.Counter = collections.Counter()
    for case in collect(bind_operands=const_operands):
        if case.expanded:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "m.onnx")
            with open(path, "wb") as f:
                f.write(case.model)
            try:
                model = load_onnx(path)
            except Exception:  # noqa: BLE001 - load failures are the conformance report's
                continue
        try:
            import_onnx(model)
        except Exception as err:  # noqa: BLE001
            if "the converter does not implement" in str(err):
                what = str(err).split("does not implement ", 1)[1].split("; refusing")[0]
                refusals[(case.op, re.sub(r"=[^;]*", "", what))] += 1
    return refusals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--static-only", action="store_true")
    ap.add_argument("--const-operands", action="store_true",
                    help="bind operand inputs as initializers, as exported models have them")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    print("static: schema attributes no converter source names")
    for op, attrs in static_view().items():
        print(f"  {op}: {', '.join(attrs)}")
    if not args.static_only:
        refusals = dynamic_view(args.const_operands)
        print(f"dynamic: conformance cases refused for an unread attribute or input: "
              f"{sum(refusals.values())}")
        for (op, what), n in sorted(refusals.items()):
            print(f"  {op}: {what} ({n} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
