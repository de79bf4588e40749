"""The dense encoder: our own forward pass gives FlagEmbedding's vectors, and the traced
single-text path (queries) gives the eager model's."""

from __future__ import annotations

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


def test_single_text_traced_path_matches_the_eager_batch_path(models):
    encoder = models[0]
    batch = encoder.encode(TEXTS)  # batched: eager model
    for i, text in enumerate(TEXTS):  # one at a time: traced model
        np.testing.assert_allclose(encoder.encode([text])[0], batch[i], atol=1e-5)
        (enc,) = encoder.encode_with_spans([text], [[(0, min(5, len(text)))]])
        np.testing.assert_allclose(enc.vector, batch[i], atol=1e-5)
    assert encoder._traced not in (None, False), "the single-text path was not traced"
