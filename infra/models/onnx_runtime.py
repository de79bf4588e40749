"""Run the encoder's transformer on ONNX Runtime, exported from the very weights FlagEmbedding loaded.

Why: on these 2-core CPUs a MiniLM forward pass over a ~15-token question costs ~12 ms in eager
PyTorch (much of it per-op Python dispatch) and ~5 ms on ONNX Runtime, whose graph optimiser
fuses attention, GELU and LayerNorm; 32-turn batches go ~1.5x faster too
(`benchmarks/encoder.py`). No ONNX model is downloaded: the export runs locally, once per
(model files, torch, ONNX Runtime) and is cached; every export is checked against the PyTorch
model on sample texts before it is used, and any failure keeps PyTorch (logged).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

log = logging.getLogger(__name__)

OPSET = 17
TOLERANCE = 1e-4  # max abs difference of hidden states vs PyTorch; observed ~3e-6 for MiniLM
# int8 (per-channel weights of the MatMuls, dynamic activations): its vectors move, so it is
# checked on what the views use — the mean-pooled, normalised vector — against PyTorch's. Observed
# on 640 LoCoMo turns: cosine ≥ 0.974, mean 0.992; quantising every op type instead (per tensor)
# gave ≥ 0.888, mean 0.951, hence MatMul only.
INT8_MIN_COSINE = 0.95
_CHECK_TEXTS = ["a question to export the model with", "Melanie: I ran a charity race for mental health last Saturday, it was great fun!"]


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memstream" / "onnx"


def cache_key(model_name: str, model_dir: str | None) -> str:
    """Changes whenever the weights, torch or onnxruntime change: name, size and mtime of every
    file of the model directory (hashing gigabytes of weights at each start would be slow)."""
    import onnxruntime
    import torch

    h = hashlib.sha256(f"{model_name}|{torch.__version__}|{onnxruntime.__version__}|{OPSET}".encode())
    if model_dir and Path(model_dir).is_dir():
        for f in sorted(Path(model_dir).rglob("*")):
            if f.is_file():
                st = f.stat()
                h.update(f"{f.relative_to(model_dir)}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:20]


def _export(model, tokenizer, path: Path) -> None:
    import torch

    example = tokenizer([_CHECK_TEXTS[0]], return_tensors="pt")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")
    os.close(fd)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # The mask code turns the constant 1.0 into a trace constant: correct, but noisy.
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(
                model, (example["input_ids"], example["attention_mask"]), tmp,
                input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                dynamic_axes={"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"},
                              "last_hidden_state": {0: "batch", 1: "tokens"}},
                opset_version=OPSET, dynamo=False,
            )
        os.replace(tmp, path)  # atomic: a concurrent start-up sees the whole file or none
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def open_session(path: Path, threads: int | None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads or 0  # 0: one per physical core
    so.inter_op_num_threads = 1
    # No busy-waiting between calls: the query path runs Python between two encoder calls and
    # the projections share two cores with the NER model; spinning threads would steal them.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _states(session, model, tokenizer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    import torch

    enc = tokenizer(_CHECK_TEXTS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        ref = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state.float().numpy()
    got = session.run(None, {"input_ids": enc["input_ids"].numpy(), "attention_mask": enc["attention_mask"].numpy()})[0]
    return ref, got, enc["attention_mask"].numpy()[..., None]


def _check(session, model, tokenizer) -> float:
    ref, got, _ = _states(session, model, tokenizer)
    return float(np.abs(got - ref).max())


def _pooled_cosine(session, model, tokenizer) -> float:
    """The smallest cosine between the export's and PyTorch's mean-pooled vectors of the check texts."""
    ref, got, mask = _states(session, model, tokenizer)
    a, b = (ref * mask).sum(1) / mask.sum(1), (got * mask).sum(1) / mask.sum(1)
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def _quantize(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fd, tmp = tempfile.mkstemp(dir=dst.parent, suffix=".onnx.tmp")
    os.close(fd)
    try:
        quantize_dynamic(str(src), tmp, weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"])
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _cached_session(path: Path, make: Callable[[], None], score: Callable[[object], float], good: Callable[[float], bool],
                    what: str, threads: int | None) -> tuple[object, float, bool]:
    """(session, score, good) of the cached file at `path`, made by `make` when missing. A file
    that does not load, or whose session scores badly, is made again, once; a second failure to
    load raises."""
    for attempt in (1, 2):
        if not path.exists():
            make()
        try:
            session = open_session(path, threads)
            value = score(session)
        except Exception as exc:  # noqa: BLE001 - e.g. a truncated or foreign file in the cache
            if attempt == 2:
                raise
            log.warning("encoder: cached %s %s is unusable (%s); making it again", what, path, exc)
            path.unlink(missing_ok=True)
            continue
        if good(value):
            return session, value, True
        path.unlink(missing_ok=True)
    return session, value, False


def load_int8(fp32_path: Path, model, tokenizer, threads: int | None) -> tuple[object, Path] | None:
    path = fp32_path.with_name(fp32_path.stem + "-int8.onnx")

    def make() -> None:
        log.info("encoder: quantising %s to int8 at %s (once)", fp32_path.name, path)
        _quantize(fp32_path, path)

    session, cos, ok = _cached_session(path, make, lambda s: _pooled_cosine(s, model, tokenizer), lambda c: c >= INT8_MIN_COSINE,
                                       "int8 export", threads)
    if ok:
        return session, path
    log.warning("encoder: int8 export's vectors differ from PyTorch's (cosine %.3f < %.2f)", cos, INT8_MIN_COSINE)
    return None


def load_session(model, tokenizer, model_name: str, model_dir: str | None, cache_dir: Path | None,
                 threads: int | None, int8: bool = False) -> tuple[object, Path] | None:
    """(An ONNX Runtime session equal to `model` on sample texts, the export it runs), or None
    (then use PyTorch). A cached export that does not load or does not match is exported again, once.
    `int8`: the session of the export's 8-bit quantisation instead (checked by pooled cosine)."""
    try:
        path = (cache_dir or default_cache_dir()) / f"{model_name.replace('/', '_')}-{cache_key(model_name, model_dir)}.onnx"

        def make() -> None:
            log.info("encoder: exporting %s to ONNX at %s (once per model/torch/onnxruntime version)", model_name, path)
            _export(model, tokenizer, path)

        session, diff, ok = _cached_session(path, make, lambda s: _check(s, model, tokenizer), lambda d: d <= TOLERANCE, "ONNX export", threads)
        if ok:
            return load_int8(path, model, tokenizer, threads) if int8 else (session, path)
        log.warning("encoder: ONNX export of %s differs from PyTorch by %.2g (> %.0e); using PyTorch", model_name, diff, TOLERANCE)
        return None
    except Exception as exc:  # noqa: BLE001 - any export/runtime problem: PyTorch still works
        log.warning("encoder: ONNX Runtime unavailable for %s (%s: %s); using PyTorch", model_name, type(exc).__name__, exc)
        return None
