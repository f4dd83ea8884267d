"""Token generation on a decoder-with-past model: a prefill of the prompt, then decode steps of
one token, each step's `present` keys and values fed back as the next step's `past` (issue 47).

Three parts:

- `detect_signature(inputs, outputs)`: which inputs and outputs are the token ids, mask,
  positions, logits and the per-layer past/present pairs. Names as tools/llm_exports.py,
  optimum and onnxruntime-genai write them (`past_key_values.N.key` <-> `present.N.key`, also
  `past_key_N` / `present_key_N`); anything else is refused with one line naming what is missing.
- `generate(session, prompt_ids, max_new_tokens, greedy)`: the loop, on anything with
  `inputs`, `outputs` and `run(feeds) -> {name: array}` (`as_session` adapts a tvmopt artifact,
  a `LoadedModel`, an onnxruntime `InferenceSession` or an .onnx path); returns the tokens and
  the time of every step.
- `run_generate_bench(...)`: `tvmopt bench --generate`: tvmopt and each baseline in a worker
  process of its own (tvmopt.bench.isolated), whole generations timed in rounds of alternating
  order, time to first token, per-token decode latency, tokens/s, ratios to onnxruntime, greedy
  tokens compared with onnxruntime's, and a memory-bandwidth floor per decode token (an
  estimate).

The KV cache is not kept in place: every step returns `present` as numpy arrays (the tvmopt
runtime copies each output off the VM's tensor) and the next step copies them in again as
`past`, into new device tensors since the past grows by one token per step.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import re
import time
from dataclasses import asdict, dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import ShapeError, TvmoptError
from ..tensor_info import TensorInfo

SCHEMA = "tvmopt.bench.generate/1"
BASELINES = ("ort", "openvino", "openvino-f32")
# --baselines name -> (isolated.Spec kind, OpenVINO precision hint)
_BASELINE_SPECS = {"ort": ("onnxruntime", None), "openvino": ("openvino", None),
                   "openvino-f32": ("openvino", "f32")}
HOST_FEATURES = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                 "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "neon",
                 "dotprod", "i8mm", "sve", "sve2", "bf16")

# past_key_values.0.key, past.0.key, past_key_values_0_key (optimum, onnxruntime-genai, ours)
_PAST = re.compile(r"^past(?:_key_values)?[._](\d+)[._](key|value)$")
_PRESENT = re.compile(r"^present(?:_key_values)?[._](\d+)[._](key|value)$")
# past_key_0 / present_value_0 (onnxruntime-genai's per-model names for some exports)
_PAST_KIND_FIRST = re.compile(r"^past_(key|value)s?[._]?(\d+)$")
_PRESENT_KIND_FIRST = re.compile(r"^present_(key|value)s?[._]?(\d+)$")


class NotADecoderError(TvmoptError):
    """The model's inputs and outputs are not a decoder-with-past signature."""


def _kv(name: str, first: re.Pattern, kind_first: re.Pattern) -> tuple[int, str] | None:
    m = first.match(name)
    if m:
        return int(m.group(1)), m.group(2)
    m = kind_first.match(name)
    return (int(m.group(2)), m.group(1)) if m else None


# ------------------------------------------------------------------------------------ signature
@dataclass(frozen=True)
class DecoderSignature:
    """The decoder-with-past inputs and outputs generate() feeds and reads.

    Attributes:
        input_ids, logits: the token-id input and the logits output.
        attention_mask, position_ids: those inputs' names, None where the model has none.
        past, present: per layer, the (key, value) input names and (key, value) output names.
        kv_heads, head_dim: dims 1 and 3 of a past tensor [batch, kv_heads, past, head_dim].
        kv_dtype: dtype of the past tensors; dtypes: every input's dtype by name.
        vocab: the logits' last dim where static.
    """

    input_ids: str
    logits: str
    attention_mask: str | None
    position_ids: str | None
    past: tuple[tuple[str, str], ...]
    present: tuple[tuple[str, str], ...]
    kv_heads: int
    head_dim: int
    kv_dtype: str
    dtypes: dict = field(default_factory=dict)
    vocab: int | None = None

    @property
    def layers(self) -> int:
        return len(self.past)

    def kv_bytes(self, batch: int, length: int) -> int:
        """Bytes of the whole cache (every layer, keys and values) at `length` tokens."""
        item = np.dtype(self.kv_dtype).itemsize
        return 2 * self.layers * batch * self.kv_heads * length * self.head_dim * item

    def empty_past(self, batch: int) -> dict[str, np.ndarray]:
        """Past tensors of length 0 ([batch, kv_heads, 0, head_dim]): the prefill's."""
        shape = (batch, self.kv_heads, 0, self.head_dim)
        return {n: np.zeros(shape, self.kv_dtype) for pair in self.past for n in pair}

    def feeds(self, ids: np.ndarray, past_len: int, past: dict[str, np.ndarray]) -> dict:
        """One step's inputs: `ids` [batch, seq] after `past_len` cached tokens."""
        batch, seq = ids.shape
        out = {self.input_ids: ids.astype(self.dtypes.get(self.input_ids, "int64"), copy=False)}
        if self.attention_mask:
            out[self.attention_mask] = np.ones((batch, past_len + seq),
                                               self.dtypes.get(self.attention_mask, "int64"))
        if self.position_ids:
            pos = np.arange(past_len, past_len + seq, dtype=self.dtypes.get(self.position_ids,
                                                                           "int64"))
            out[self.position_ids] = np.broadcast_to(pos, (batch, seq)).copy()
        out.update(past)
        return out

    def to_json(self) -> dict:
        d = asdict(self)
        d["past"] = [list(p) for p in self.past]
        d["present"] = [list(p) for p in self.present]
        d["layers"] = self.layers
        return d


def detect_signature(inputs: list[TensorInfo], outputs: list[TensorInfo]) -> DecoderSignature:
    """The decoder-with-past signature of a model's inputs and outputs.

    Raises:
        NotADecoderError: one line naming what is missing (or left over, or not static).
    """
    ins = {i.name: i for i in inputs}
    outs = {o.name: o for o in outputs}
    past: dict[int, dict[str, str]] = {}
    present: dict[int, dict[str, str]] = {}
    for name in ins:
        kv = _kv(name, _PAST, _PAST_KIND_FIRST)
        if kv:
            past.setdefault(kv[0], {})[kv[1]] = name
    for name in outs:
        kv = _kv(name, _PRESENT, _PRESENT_KIND_FIRST)
        if kv:
            present.setdefault(kv[0], {})[kv[1]] = name
    missing = []
    if "input_ids" not in ins:
        missing.append("input 'input_ids'")
    logits = "logits" if "logits" in outs else None
    if logits is None:
        missing.append("output 'logits'")
    if not past:
        missing.append("inputs 'past_key_values.N.key/value'")
    if not present:
        missing.append("outputs 'present.N.key/value'")
    for i in sorted(set(past) | set(present)):
        for kind in ("key", "value"):
            if kind not in past.get(i, {}) and past:
                missing.append(f"input 'past_key_values.{i}.{kind}'")
            if kind not in present.get(i, {}) and present:
                missing.append(f"output 'present.{i}.{kind}'")
    if past and sorted(past) != list(range(len(past))):
        missing.append(f"past layers 0..{max(past)} (found {', '.join(map(str, sorted(past)))})")
    if missing:
        raise NotADecoderError(
            f"not a decoder-with-past model: missing {', '.join(missing)} (inputs: "
            f"{', '.join(list(ins)[:6])}{', ...' if len(ins) > 6 else ''}; outputs: "
            f"{', '.join(list(outs)[:4])}{', ...' if len(outs) > 4 else ''})")
    known = {"input_ids", "attention_mask", "position_ids",
             *(n for d in past.values() for n in d.values())}
    extra = [n for n in ins if n not in known]
    if extra:
        raise NotADecoderError(f"decoder-with-past model with inputs generate() cannot fill: "
                               f"{', '.join(extra)} (it feeds input_ids, attention_mask, "
                               "position_ids and past_key_values.N.key/value)")
    first = ins[past[0]["key"]]
    shape = first.shape or ()
    if len(shape) != 4:
        raise NotADecoderError(f"input '{first.name}' has shape {first.shape_str()}; a past "
                               "tensor is [batch, kv_heads, past, head_dim]")
    kv_heads, head_dim = shape[1], shape[3]
    if not (isinstance(kv_heads, int) and isinstance(head_dim, int)):
        raise NotADecoderError(f"input '{first.name}' has a symbolic kv_heads or head_dim "
                               f"({first.shape_str()}); fix them with --shape "
                               f"{first.name}=BATCHxHEADSxPASTxDIM when compiling")
    vocab = (outs[logits].shape or (None,))[-1]
    return DecoderSignature(
        input_ids="input_ids", logits=logits,
        attention_mask="attention_mask" if "attention_mask" in ins else None,
        position_ids="position_ids" if "position_ids" in ins else None,
        past=tuple((past[i]["key"], past[i]["value"]) for i in range(len(past))),
        present=tuple((present[i]["key"], present[i]["value"]) for i in range(len(past))),
        kv_heads=kv_heads, head_dim=head_dim, kv_dtype=first.dtype,
        dtypes={n: i.dtype for n, i in ins.items()},
        vocab=vocab if isinstance(vocab, int) else None)


# ------------------------------------------------------------------------------------ sessions
@dataclass
class FunctionSession:
    """A session from a signature and a run function: what every adapter returns."""

    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    run: Callable[[dict], dict]
    name: str = "session"


_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
              "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(bool)": "bool",
              "tensor(bfloat16)": "bfloat16"}


def _ort_infos(args) -> list[TensorInfo]:
    return [TensorInfo(a.name, tuple(d if isinstance(d, (int, str)) else None
                                     for d in (a.shape or ())), _ORT_TYPES.get(a.type, a.type))
            for a in args]


def ort_session(sess) -> FunctionSession:
    """An onnxruntime InferenceSession as a session."""
    names = [o.name for o in sess.get_outputs()]
    return FunctionSession(_ort_infos(sess.get_inputs()), _ort_infos(sess.get_outputs()),
                           lambda feeds: dict(zip(names, sess.run(None, feeds))), "onnxruntime")


def tvmopt_session(loaded) -> FunctionSession:
    """A loaded tvmopt artifact (tvmopt.load) as a session."""
    return FunctionSession(loaded.inputs, loaded.outputs, loaded.run, "tvmopt")


def onnx_signature(path) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """An .onnx file's declared inputs and outputs (its weights are not read)."""
    import onnx

    from ..frontend.onnx_model import graph_inputs, graph_outputs

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:
        raise TvmoptError(f"{path}: cannot read the ONNX model: {type(err).__name__}: "
                          f"{str(err).strip()[:160]}") from None
    return graph_inputs(model), graph_outputs(model)


def as_session(obj, threads: int | None = None):
    """Adapt what generate() may be given: a tvmopt artifact folder or `LoadedModel`, an .onnx
    path (run by onnxruntime), an onnxruntime `InferenceSession`, or anything that already has
    `inputs`, `outputs` and `run(feeds)`."""
    if isinstance(obj, (str, Path)):
        p = Path(obj)
        if p.is_dir():
            from ..runtime.loader import load

            return tvmopt_session(load(p))
        if p.suffix.lower() == ".onnx":
            from ..runtime.verify import ort_session as make_ort

            return ort_session(make_ort(str(p), threads=threads or os.cpu_count() or 1))
        raise TvmoptError(f"{obj}: neither a tvmopt artifact folder nor an .onnx file")
    if hasattr(obj, "vm") and hasattr(obj, "artifact"):
        return tvmopt_session(obj)
    if hasattr(obj, "get_inputs") and hasattr(obj, "get_outputs"):
        return ort_session(obj)
    if all(hasattr(obj, a) for a in ("inputs", "outputs", "run")):
        return obj
    raise TvmoptError(f"cannot generate with a {type(obj).__name__}: give a tvmopt artifact "
                      "(path or tvmopt.load(...)), an .onnx path or an onnxruntime "
                      "InferenceSession")


# ------------------------------------------------------------------------------------ the loop
@dataclass
class Generation:
    """What one generation produced and how long each step took.

    Attributes:
        tokens: [batch, new_tokens] generated ids (the first from the prefill).
        prefill_ms: the prefill step: time to first token (feeds, run, next-token choice).
        step_ms: every decode step after it, in order (past length prompt_len, +1, ...).
    """

    tokens: np.ndarray
    prefill_ms: float
    step_ms: list[float]

    def to_json(self) -> dict:
        return {"tokens": self.tokens.tolist(), "prefill_ms": self.prefill_ms,
                "step_ms": list(self.step_ms)}


def _prompt(prompt_ids) -> np.ndarray:
    p = np.asarray(prompt_ids)
    if p.ndim == 1:
        p = p[None, :]
    if p.ndim != 2 or p.shape[1] < 1 or not np.issubdtype(p.dtype, np.integer):
        raise ShapeError(f"prompt_ids: expected integer token ids [seq] or [batch, seq], got "
                         f"{p.dtype} {list(p.shape)}")
    return p.astype(np.int64)


def generate(session, prompt_ids, max_new_tokens: int, greedy: bool = True, seed: int = 0,
             signature: DecoderSignature | None = None,
             clock: Callable[[], float] = time.perf_counter) -> Generation:
    """Generate `max_new_tokens` tokens after `prompt_ids`: a prefill (past length 0), then
    one-token decode steps, each fed the previous step's present keys and values.

    Args:
        session: anything as_session() takes.
        prompt_ids: token ids, [seq] or [batch, seq] (no padding: every mask entry is 1).
        greedy: the most likely token each step; False: sampled from the softmax (`seed`).
        signature: the decoder signature (default: detected from the session).
        clock: seconds, for the step times.

    Raises:
        NotADecoderError: the model is not a decoder with past.
        ShapeError: bad prompt or token count.
    """
    if max_new_tokens < 1:
        raise ShapeError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    session = as_session(session)
    sig = signature or detect_signature(list(session.inputs), list(session.outputs))
    ids = _prompt(prompt_ids)
    batch = ids.shape[0]
    rng = np.random.default_rng(seed)
    past, past_len = sig.empty_past(batch), 0
    tokens, times = [], []
    for _ in range(max_new_tokens):
        t0 = clock()
        out = session.run(sig.feeds(ids, past_len, past))
        logits = np.asarray(out[sig.logits])
        last = logits[:, -1, :] if logits.ndim == 3 else logits
        if greedy:
            nxt = last.argmax(-1)
        else:
            z = np.exp(last - last.max(-1, keepdims=True))
            p = z / z.sum(-1, keepdims=True)
            nxt = np.array([rng.choice(p.shape[-1], p=row) for row in p])
        past = {n: out[o] for pn, po in zip(sig.past, sig.present) for n, o in zip(pn, po)}
        past_len += ids.shape[1]
        ids = nxt.astype(np.int64).reshape(batch, 1)
        times.append((clock() - t0) * 1e3)
        tokens.append(ids[:, 0])
    return Generation(np.stack(tokens, 1), times[0], times[1:])


def generate_ids(artifact_or_loaded, prompt_ids, max_new_tokens: int = 16, greedy: bool = True,
                 seed: int = 0) -> np.ndarray:
    """`tvmopt.generate`: the ids generated after `prompt_ids` ([new] for a [seq] prompt,
    [batch, new] for [batch, seq]) by a tvmopt artifact (a folder or tvmopt.load(...)), or any
    session generate() takes."""
    g = generate(artifact_or_loaded, prompt_ids, max_new_tokens, greedy=greedy, seed=seed)
    return g.tokens[0] if np.asarray(prompt_ids).ndim == 1 else g.tokens


# ------------------------------------------------------------------------------------ workers
def _serve_generate(conn, spec, threads: int, sig: DecoderSignature, prompt: np.ndarray,
                    new_tokens: int, warmup_tokens: int, greedy: bool, seed: int) -> None:
    """A runtime's worker: load (isolated's runtimes, threads and environment), one warm-up
    generation, then one timed generation per request."""
    from .isolated import _make_runtime, enter_worker

    enter_worker(spec, threads)
    try:
        run, info = _make_runtime(spec, threads)
        session = FunctionSession([], [], run, spec.kind)
        if warmup_tokens:
            generate(session, prompt, warmup_tokens, greedy, seed, signature=sig)
        conn.send(("ready", info))
    except Exception as err:  # noqa: BLE001 - sent to the parent, which names the runtime
        conn.send(("error", f"{type(err).__name__}: {err}".splitlines()[0]))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if msg[0] != "generate":
            return
        try:
            conn.send(("generation", generate(session, prompt, new_tokens, greedy, seed,
                                              signature=sig)))
        except Exception as err:  # noqa: BLE001 - sent to the parent, which names the runtime
            conn.send(("error", f"{type(err).__name__}: {err}".splitlines()[0]))


class GenerateWorker:
    """One runtime in a process of its own (spawned: no thread pool inherited), loaded and
    warmed up; it blocks on its pipe while another runtime generates."""

    def __init__(self, name: str, spec, threads: int, sig: DecoderSignature, prompt: np.ndarray,
                 new_tokens: int, warmup_tokens: int, greedy: bool = True, seed: int = 0):
        self.name = name
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_generate, daemon=True, args=(
            child, spec, threads, sig, prompt, new_tokens, warmup_tokens, greedy, seed))
        self._proc.start()
        kind, payload = self._conn.recv()
        if kind == "error":
            self._proc.join(5)
            raise TvmoptError(f"runtime {name}: {payload}")
        self.info = payload

    def generate(self) -> Generation:
        self._conn.send(("generate",))
        kind, payload = self._conn.recv()
        if kind == "error":
            raise TvmoptError(f"runtime {self.name}: {payload}")
        return payload

    def close(self) -> None:
        from .isolated import stop

        stop(self._conn, self._proc)


def rounds_alternating(workers: dict, rounds: int, gap_s: float | None = None,
                       sleep: Callable[[float], None] = time.sleep) -> dict[str, list]:
    """Every worker's generations: `rounds` rounds, the order reversed every other round, an
    idle gap before each (the previous runtime's spinning threads wind down)."""
    from .isolated import GAP_S

    gap = GAP_S if gap_s is None else gap_s
    out = {k: [] for k in workers}
    names = list(workers)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            sleep(gap)
            out[name].append(workers[name].generate())
    return out


# ------------------------------------------------------------------------------------ the bench
@dataclass
class GenerateOptions:
    """`tvmopt bench --generate`.

    Attributes:
        prompt_len: prompt tokens (random ids from `seed`, below the vocabulary size).
        new_tokens: tokens generated per round (the first by the prefill).
        rounds: timed generations per runtime; warmup_tokens: tokens of the untimed generation
            each worker runs first.
        batch: prompts per generation.
        baselines: subset of BASELINES; onnxruntime always runs (ratios, the token check).
        threads: every runtime's threads (default: all cores).
    """

    prompt_len: int = 512
    new_tokens: int = 32
    rounds: int = 3
    warmup_tokens: int = 4
    batch: int = 1
    baselines: list[str] = field(default_factory=list)
    threads: int | None = None
    greedy: bool = True
    seed: int = 0

    def __post_init__(self):
        if self.prompt_len < 1 or self.new_tokens < 1 or self.rounds < 1 or self.batch < 1:
            raise TvmoptError("--prompt-len, --new-tokens, --runs and --batch must be >= 1")
        bad = [b for b in self.baselines if b not in BASELINES]
        if bad:
            raise TvmoptError(f"--baselines with --generate: unknown {', '.join(bad)} "
                              f"(choose from {', '.join(BASELINES)})")
        if "ort" not in self.baselines:
            self.baselines = ["ort", *self.baselines]
        self.threads = self.threads or os.cpu_count() or 1
        self.warmup_tokens = max(0, min(self.warmup_tokens, self.new_tokens))


def host_info() -> dict:
    """CPU model, ISA features that set kernel speed, and the memory bandwidth the floor uses."""
    from ..targets.registry import detect_host, host_cpu_features
    from ..timing import host_id

    feats = host_cpu_features()
    d = {"platform": platform.platform(), "cpu_model": host_id() or platform.processor() or None,
         "cpu_count": os.cpu_count(), "features": [f for f in HOST_FEATURES if f in feats],
         "bandwidth_gbs": None, "bandwidth_source": None}
    from ..targets.registry import host_preset

    host, base = detect_host(), host_preset()
    bw = host.memory.get("bandwidth_gbs")
    if bw is not None:
        d["bandwidth_gbs"] = host.bandwidth_gbs()
        d["bandwidth_source"] = (f"targets/ entry '{base.name if base else '?'}' (its reference "
                                 f"machine, whole socket: {bw.source})")
    return d


def weight_bytes(artifact: str, model: str | None) -> tuple[int | None, str]:
    """Bytes of weights a decode step reads, from file sizes: the model file (and its external
    data beside it) where known, else the artifact's compiled library (code included)."""
    if model and Path(model).exists():
        p = Path(model)
        extra = [q for q in (p.with_name(p.name + ".data"), p.with_suffix(".data"),
                             p.with_suffix(".onnx_data")) if q.exists()]
        return (p.stat().st_size + sum(q.stat().st_size for q in extra),
                "size of " + ", ".join(x.name for x in [p, *extra]))
    lib = Path(artifact) / "model.so"
    if lib.exists():
        return lib.stat().st_size, "size of the artifact's model.so (code included)"
    return None, "unknown"


def floor_estimate(sig: DecoderSignature, opts: GenerateOptions, weights: int | None,
                   weights_from: str, bandwidth_gbs: float | None) -> dict | None:
    """Per decode token: (weights + the KV cache read at that length) / memory bandwidth."""
    if not weights or not bandwidth_gbs:
        return None
    first = opts.prompt_len  # the past the first decode step reads
    last = opts.prompt_len + max(opts.new_tokens - 2, 0)

    def ms(length):
        return (weights + sig.kv_bytes(opts.batch, length)) / (bandwidth_gbs * 1e9) * 1e3

    return {"estimate": True, "weights_bytes": weights, "weights_from": weights_from,
            "kv_bytes_first_step": sig.kv_bytes(opts.batch, first),
            "kv_bytes_last_step": sig.kv_bytes(opts.batch, last),
            "bandwidth_gbs": bandwidth_gbs, "ms_first_step": ms(first), "ms_last_step": ms(last),
            "ms_mean": float(np.mean([ms(n) for n in range(first, last + 1)]))}


def _summary(gens: list[Generation], batch: int) -> dict:
    from .stats import summarize

    ttft = summarize([g.prefill_ms / 1e3 for g in gens], batch).to_json()
    steps = [t for g in gens for t in g.step_ms]
    decode = summarize([t / 1e3 for t in steps], batch).to_json() if steps else None
    total_ms = [g.prefill_ms + sum(g.step_ms) for g in gens]
    new = gens[0].tokens.shape[1] * batch
    return {"ttft": ttft, "decode": decode,
            "decode_tokens_per_s": decode["throughput"] if decode else None,
            "tokens_per_s": float(new * 1e3 / np.median(total_ms)),
            "rounds": [{"prefill_ms": g.prefill_ms, "step_ms": list(g.step_ms)} for g in gens]}


def _ratios(rows: list[dict]) -> None:
    ort = next((r for r in rows if r["runner"] == "onnxruntime"), None)
    for r in rows:
        if ort is None:
            r["ratio_to_ort"] = None
            continue

        def div(a, b):
            return a / b if a is not None and b else None

        dec, odec = r["decode"] or {}, ort["decode"] or {}
        r["ratio_to_ort"] = {"ttft_p50": div(r["ttft"]["p50_ms"], ort["ttft"]["p50_ms"]),
                             "decode_p50": div(dec.get("p50_ms"), odec.get("p50_ms")),
                             "decode_p95": div(dec.get("p95_ms"), odec.get("p95_ms")),
                             "tokens_per_s": div(r["tokens_per_s"], ort["tokens_per_s"])}


def _token_check(tokens: dict[str, list]) -> dict:
    mine, ref = tokens.get("tvmopt"), tokens.get("onnxruntime")
    if mine is None or ref is None:
        return {"match": None, "first_mismatch": None, "note": "onnxruntime did not run"}
    a, b = np.asarray(mine), np.asarray(ref)
    if a.shape == b.shape and (a == b).all():
        return {"match": True, "first_mismatch": None}
    diff = np.argwhere(a != b) if a.shape == b.shape else np.zeros((1, 2), int)
    row, step = (int(x) for x in diff[0])
    return {"match": False, "first_mismatch": {"batch": row, "step": step,
                                               "tvmopt": int(a[row, step]),
                                               "onnxruntime": int(b[row, step])}}


def run_generate_bench(artifact: str, model: str | None, opts: GenerateOptions,
                       log=print) -> dict:
    """Time generation on a tvmopt artifact and the baselines, each in its own process.

    Args:
        artifact: the artifact folder; model: its .onnx file for the baselines (None: none run).

    Returns:
        The result document (schema SCHEMA, docs/generation.md).

    Raises:
        NotADecoderError: the artifact is not a decoder with past.
        TvmoptError: tvmopt's worker fails.
    """
    from .. import stage
    from ..runtime.artifact import read_artifact
    from .isolated import Spec
    from .suite import _versions

    os.environ.setdefault("TVM_NUM_THREADS", str(opts.threads))
    art = read_artifact(artifact)
    sig = detect_signature(art.inputs, art.outputs)
    high = sig.vocab or 1000  # ids below the vocabulary size (1000 where it is symbolic)
    prompt = np.random.default_rng(opts.seed).integers(0, high, (opts.batch, opts.prompt_len),
                                                       dtype=np.int64)
    warnings: list[str] = []
    doc = {"schema": SCHEMA, "versions": _versions([]) | _ov_version(opts.baselines),
           "host": {**host_info(), "threads": opts.threads,
                    "tvm_threads_env": os.environ.get("TVM_NUM_THREADS")},
           "artifact": str(artifact), "model": model, "target": art.manifest["target"]["name"],
           "precision": art.manifest["precision"]["default"], "signature": sig.to_json(),
           "options": asdict(opts), "warnings": warnings, "baselines": {}}
    workers: dict[str, GenerateWorker] = {}
    try:
        stage.enter("generate: tvmopt worker", str(artifact))
        log(f"tvmopt: loading {artifact}, warm-up generation")
        workers["tvmopt"] = GenerateWorker("tvmopt", Spec("tvmopt", str(artifact)), opts.threads,
                                           sig, prompt, opts.new_tokens, opts.warmup_tokens,
                                           opts.greedy, opts.seed)
        for name in opts.baselines:
            if model is None:
                doc["baselines"][name] = ("unavailable: the artifact's model was not found "
                                          "beside it (pass --model)")
                continue
            kind, precision = _BASELINE_SPECS[name]
            if kind == "openvino" and find_spec("openvino") is None:
                doc["baselines"][name] = ("unavailable: OpenVINO is not installed (pip install "
                                          "'tvmopt[baselines]')")
                continue
            try:
                base_sig = detect_signature(*onnx_signature(model))
            except TvmoptError as err:
                doc["baselines"][name] = f"unavailable: {err}"
                continue
            stage.enter(f"generate: {name} worker", model)
            log(f"{name}: loading {Path(model).name}, warm-up generation")
            try:
                w = GenerateWorker(name, Spec(kind, str(model), precision=precision),
                                   opts.threads, base_sig, prompt, opts.new_tokens,
                                   opts.warmup_tokens, opts.greedy, opts.seed)
            except TvmoptError as err:
                doc["baselines"][name] = f"unavailable: {err}"
                continue
            label = "onnxruntime" if name == "ort" else name
            workers[label] = w
            p = w.info.get("precision")
            doc["baselines"][name] = "ok" + (f" (precision {p})" if p else "")
        for name, st in doc["baselines"].items():
            if not st.startswith("ok"):
                warnings.append(f"baseline {name} {st}")
        log(f"{opts.rounds} round(s) of prompt {opts.prompt_len} + {opts.new_tokens} tokens: "
            f"{', '.join(workers)}")
        stage.enter("generate: timed rounds")
        gens = rounds_alternating(workers, opts.rounds)
    finally:
        for w in workers.values():
            w.close()
    rows = [{"runner": name, "info": workers[name].info, **_summary(g, opts.batch)}
            for name, g in gens.items()]
    _ratios(rows)
    doc["runtimes"] = rows
    tokens = {name: g[0].tokens.tolist() for name, g in gens.items()}
    doc["tokens"] = {"greedy": opts.greedy, "by_runner": tokens, **_token_check(tokens)}
    if opts.greedy and doc["tokens"]["match"] is False:
        m = doc["tokens"]["first_mismatch"]
        warnings.append(f"tvmopt's greedy tokens differ from onnxruntime's from step {m['step']} "
                        f"(batch row {m['batch']}: {m['tvmopt']} vs {m['onnxruntime']})")
    noisy = [f"{r['runner']} {r['decode']['cv']:.0%}" for r in rows
             if r["decode"] and r["decode"]["noisy"]]
    if noisy:
        warnings.append("per-token decode CV above 10% (" + ", ".join(noisy) + "): the machine "
                        "is too noisy to trust small differences")
    wb, wfrom = weight_bytes(artifact, model)
    doc["floor"] = floor_estimate(sig, opts, wb, wfrom, doc["host"]["bandwidth_gbs"])
    return doc


def _ov_version(baselines) -> dict:
    if not any(b.startswith("openvino") for b in baselines):
        return {}
    from importlib.metadata import PackageNotFoundError, version

    try:
        return {"openvino": version("openvino")}
    except PackageNotFoundError:
        return {"openvino": None}


# ------------------------------------------------------------------------------------ output
def print_generation(doc: dict, echo=print) -> None:
    """The result as lines of text."""
    o, h = doc["options"], doc["host"]
    echo(f"tvmopt bench --generate {doc['artifact']}  (target {doc['target']}, "
         f"precision {doc['precision']}; {o['threads']} threads each)")
    echo(f"  host: {h['cpu_model'] or 'unknown CPU'}, {h['cpu_count']} cores, features "
         f"{' '.join(h['features']) or '-'}")
    echo(f"  prompt {o['prompt_len']} tokens, {o['new_tokens']} new (batch {o['batch']}, "
         f"{'greedy' if o['greedy'] else 'sampled'}), {o['rounds']} round(s) per runtime, "
         "alternating order, each runtime in its own process")
    for name, st in doc["baselines"].items():
        echo(f"  baseline {name}: {st}")
    for r in doc["runtimes"]:
        rat = r["ratio_to_ort"] or {}

        def x(key):
            v = rat.get(key)
            return "" if v is None or r["runner"] == "onnxruntime" else f" ({v:.2f}x ort)"

        echo(f"{r['runner']}:")
        echo(f"  time to first token (prefill): p50 {r['ttft']['p50_ms']:.2f} ms"
             f"{x('ttft_p50')}")
        d = r["decode"]
        if d:
            echo(f"  per-token decode: p50 {d['p50_ms']:.3f} ms{x('decode_p50')}, "
                 f"p95 {d['p95_ms']:.3f} ms{x('decode_p95')} ({d['n']} steps)")
            echo(f"  decode tokens/s: {r['decode_tokens_per_s']:.1f}")
        echo(f"  tokens/s (prefill + decode): {r['tokens_per_s']:.1f}{x('tokens_per_s')}")
    t = doc["tokens"]
    if t["match"] is True:
        echo(f"tokens: tvmopt's {'greedy ' if t['greedy'] else ''}tokens equal onnxruntime's")
    elif t["match"] is False:
        m = t["first_mismatch"]
        echo(f"tokens: tvmopt's tokens DIFFER from onnxruntime's from step {m['step']} "
             f"({m['tvmopt']} vs {m['onnxruntime']})")
    else:
        echo(f"tokens: not compared ({t.get('note')})")
    f = doc["floor"]
    if f:
        echo(f"floor per decode token (estimate): {f['ms_first_step']:.3f} -> "
             f"{f['ms_last_step']:.3f} ms = ({f['weights_bytes'] / 2**20:.1f} MiB weights "
             f"[{f['weights_from']}] + {f['kv_bytes_first_step'] / 2**20:.2f} -> "
             f"{f['kv_bytes_last_step'] / 2**20:.2f} MiB KV cache) / "
             f"{f['bandwidth_gbs']:g} GB/s")
        echo(f"  bandwidth: {h['bandwidth_source']}")
        for r in doc["runtimes"]:
            if r["decode"] and f["ms_mean"]:
                echo(f"  {r['runner']}: decode p50 = {r['decode']['p50_ms'] / f['ms_mean']:.1f}x "
                     "the mean floor")
    else:
        echo("floor per decode token: not computable here (no bandwidth figure for this host "
             "in targets/, or no weight size)")
    for w in doc["warnings"]:
        echo(f"warning: {w}")
