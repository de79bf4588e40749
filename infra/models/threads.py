"""One BLAS thread in every process that runs the models.

The heavy compute runs on ONNX Runtime (the encoder) and thinc (the NER); NumPy and SciPy's
BLAS only sees small products (a question against hundreds of unit vectors). OpenBLAS keeps its
extra thread spinning for a while after each call, though, and on two cores that thread takes
the core the encoder's forward pass or the NER needs: with the question's forward pass
overlapped (services/query/context.py, `prefetch_question`) the query thread lost ~3 ms per
question to it, i.e. the overlap gained nothing (docs/results/query.md). Ingest shows no
measurable difference (benchmarks/ingest.py, runs alternated: 67.9, 66.5, 66.4 turns/s with one
BLAS thread, 60.5 and 71.0 with two).

An OPENBLAS_NUM_THREADS already in the environment is respected.
"""

from __future__ import annotations

import os


def single_threaded_blas() -> None:
    if "OPENBLAS_NUM_THREADS" in os.environ:  # the user's choice, or already done
        return
    from threadpoolctl import threadpool_limits

    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # BLAS libraries loaded later read it when they load
    threadpool_limits(limits=1, user_api="blas")  # the ones already loaded
