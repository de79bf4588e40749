"""The dense encoder: our own forward pass (ONNX Runtime by default) gives FlagEmbedding's
vectors, one text at a time and in batches, and the PyTorch fallback gives the same."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.e2e

TEXTS = ["When did Caroline go to the LGBTQ support group?", "Pottery", "Melanie: I ran a charity race for mental health last Saturday.",
         "Where did they plan to travel for the summer holidays with the kids, the dog and grandma?"]


def test_vectors_equal_flagembedding_encode(models):
    from FlagEmbedding import FlagModel

    from infra.models.flagembedding import default_model_path

    encoder = models[0]
    reference = FlagModel(default_model_path(), pooling_method="mean", devices="cpu", use_fp16=False).encode(TEXTS)
    ours = encoder.encode(TEXTS)
    np.testing.assert_allclose(ours, reference / np.linalg.norm(reference, axis=1, keepdims=True), atol=1e-5)


def test_single_texts_and_spans_match_the_batch_path(models):
    encoder = models[0]
    assert encoder.active_runtime == "onnx", "the default runtime fell back to PyTorch (see the log for why)"
    batch = encoder.encode(TEXTS)
    for i, text in enumerate(TEXTS):  # one at a time: no padding
        np.testing.assert_allclose(encoder.encode([text])[0], batch[i], atol=1e-5)
        (enc,) = encoder.encode_with_spans([text], [[(0, min(5, len(text)))]])
        np.testing.assert_allclose(enc.vector, batch[i], atol=1e-5)
        states = encoder.encode_states(text)  # the query path: spans pooled after the forward pass
        np.testing.assert_allclose(states.vector, batch[i], atol=1e-5)
        np.testing.assert_allclose(states.pool([(0, min(5, len(text)))]), enc.spans, atol=1e-6)
        assert states.pool([]).shape == (0, encoder.dim)
        pending = encoder.submit_states(text)  # the forward pass on the encoder's thread
        np.testing.assert_array_equal(pending.result().vector, states.vector)
        np.testing.assert_array_equal(pending.result().pool([(0, min(5, len(text)))]), states.pool([(0, min(5, len(text)))]))


def test_single_text_path_truncates_like_the_batch_path(models):
    """Questions skip the tokenizer wrapper; a text over max_length tokens still gets the
    wrapper's truncation, so its vector equals `encode`'s."""
    encoder = models[0]
    long_text = "Caroline went to the support group again " * 60  # ~420 tokens > 256
    np.testing.assert_allclose(encoder.encode_states(long_text).vector, encoder.encode([long_text])[0], atol=1e-5)
    np.testing.assert_allclose(encoder.submit_states(long_text).result().vector, encoder.encode([long_text])[0], atol=1e-5)


def test_submitted_passes_run_concurrently_and_keep_their_own_results(models):
    """Questions of concurrent requests go through one worker thread; each gets its own vector."""
    encoder = models[0]
    pending = [encoder.submit_states(t) for t in TEXTS * 3]
    expected = encoder.encode(TEXTS)
    for i, p in enumerate(pending):
        np.testing.assert_allclose(p.result().vector, expected[i % len(TEXTS)], atol=1e-5)


def test_models_leave_one_blas_thread(models):
    """OpenBLAS's spinning helper thread took the core the question's forward pass runs on
    (infra/models/threads.py): once the models are up, every loaded BLAS runs one thread, or
    what OPENBLAS_NUM_THREADS says when it was set before."""
    import os

    from threadpoolctl import threadpool_info

    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    assert blas, "no BLAS library loaded?"
    assert {i["num_threads"] for i in blas} == {int(os.environ["OPENBLAS_NUM_THREADS"])}


def test_torch_runtime_gives_the_same_vectors_and_spans(models, tmp_path):
    from infra.models.flagembedding import FlagEmbeddingEncoder

    torch_encoder = FlagEmbeddingEncoder(runtime="torch")
    torch_encoder.start()
    assert torch_encoder.active_runtime == "torch"
    np.testing.assert_allclose(torch_encoder.encode(TEXTS), models[0].encode(TEXTS), atol=1e-5)
    spans = [[(0, 4), (5, 12)] for _ in TEXTS]
    for a, b in zip(torch_encoder.encode_with_spans(TEXTS, spans), models[0].encode_with_spans(TEXTS, spans)):
        np.testing.assert_allclose(a.spans, b.spans, atol=1e-5)
        np.testing.assert_allclose(a.mean, b.mean, atol=1e-4)
        assert a.tokens == b.tokens


def test_onnx_export_is_cached_and_a_broken_cache_is_exported_again(models, tmp_path):
    from infra.models.flagembedding import FlagEmbeddingEncoder

    first = FlagEmbeddingEncoder(cache_dir=tmp_path)
    first.start()
    (exported,) = list(tmp_path.glob("*.onnx"))
    assert first.active_runtime == "onnx"
    mtime = exported.stat().st_mtime_ns
    second = FlagEmbeddingEncoder(cache_dir=tmp_path)
    second.start()
    assert exported.stat().st_mtime_ns == mtime, "the export was redone instead of reused"
    exported.write_bytes(b"not an onnx model")  # e.g. a disk that filled up mid-write elsewhere
    repaired = FlagEmbeddingEncoder(cache_dir=tmp_path)
    repaired.start()
    assert repaired.active_runtime == "onnx"
    np.testing.assert_allclose(repaired.encode(TEXTS), models[0].encode(TEXTS), atol=1e-5)


def test_an_impossible_export_falls_back_to_torch(models, tmp_path):
    from infra.models.flagembedding import FlagEmbeddingEncoder

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    encoder = FlagEmbeddingEncoder(cache_dir=not_a_dir)  # the export cannot be written there
    encoder.start()
    assert encoder.active_runtime == "torch"
    np.testing.assert_allclose(encoder.encode(TEXTS), models[0].encode(TEXTS), atol=1e-5)


def test_int8_precision_is_another_model_close_to_fp32(models, tmp_path):
    """MEMSTREAM_ENCODER_PRECISION=int8: the quantised export, recorded as `<model>+int8` (a
    generation's questions are encoded by the model its vectors came from), cached beside the fp32
    export, its vectors close to fp32's but not equal; asked for by that name, it is rebuilt."""
    from infra.models.flagembedding import FlagEmbeddingEncoder
    from infra.registry import Registry
    from infra.settings import Settings

    settings = Settings.load(data_dir=tmp_path / "d")
    settings = settings.model_copy(update={"encoder": settings.encoder.model_copy(update={"precision": "int8", "cache_dir": tmp_path / "c"})})
    registry = Registry(settings)
    assert registry.encoder_name == "all-MiniLM-L6-v2+int8"
    int8 = registry.encoder()
    int8.start()
    assert int8.model_name == "all-MiniLM-L6-v2+int8" and int8.precision == "int8" and int8.active_runtime == "onnx"
    assert sorted(p.name.endswith("-int8.onnx") for p in (tmp_path / "c").glob("*.onnx")) == [False, True]
    a, b = int8.encode(TEXTS), models[0].encode(TEXTS)
    cos = (a * b).sum(axis=1)
    assert cos.min() > 0.95 and not np.allclose(a, b, atol=1e-3)
    # A generation built with int8, read by a process configured for fp32, still gets int8.
    fp32 = Registry(Settings.load(data_dir=tmp_path / "e"))
    assert fp32.encoder_name == "all-MiniLM-L6-v2"
    again = fp32.encoder("all-MiniLM-L6-v2+int8")
    assert again.precision == "int8"
    with pytest.raises(Exception, match="ONNX Runtime"):
        FlagEmbeddingEncoder(runtime="torch", precision="int8")


def test_another_sentence_transformers_directory_loads_by_name_with_its_own_pooling(models, tmp_path):
    """Any local sentence-transformers model is accepted by name and path, pooled as its directory
    declares: the default model's own directory under another name gives the default's vectors."""
    from infra.models.flagembedding import FlagEmbeddingEncoder, default_model_path, sentence_transformers_pooling
    from schemas.errors import ConfigurationError

    other = FlagEmbeddingEncoder("my-minilm", default_model_path(), runtime="torch")
    other.start()
    assert (other.model_name, other.dim) == ("my-minilm", models[0].dim)
    np.testing.assert_allclose(other.encode(TEXTS), models[0].encode(TEXTS), atol=1e-5)

    def pooled(**modes) -> Path:
        """A model directory whose pooling module declares `modes` (none: no pooling module)."""
        d = tmp_path / ("-".join(sorted(modes)) or "none")
        d.mkdir()
        if modes:
            (d / "1_Pooling").mkdir()
            (d / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 8, **modes}))
        return d

    assert sentence_transformers_pooling(pooled(pooling_mode_mean_tokens=True, pooling_mode_cls_token=False)) == "mean"
    assert sentence_transformers_pooling(pooled(pooling_mode_cls_token=True)) == "cls"
    assert sentence_transformers_pooling(pooled()) == "mean"  # a plain transformer checkpoint
    with pytest.raises(ConfigurationError, match="pooling"):
        sentence_transformers_pooling(pooled(pooling_mode_max_tokens=True))
    with pytest.raises(ConfigurationError, match="MEMSTREAM_ENCODER_PATH"):
        FlagEmbeddingEncoder("my-minilm", None, runtime="torch").start()  # a name alone: nothing to load, nothing downloaded
