"""One BLAS thread in every process that runs the models.

The heavy compute runs on ONNX Runtime (the encoder) and thinc (the NER); NumPy and SciPy's
BLAS only sees small products (a question against hundreds of unit vectors). OpenBLAS keeps its
extra thread spinning for a while after each call, though, and on two cores that thread takes
the core the encoder's forward pass or the NER needs. Measured on the dev split: with the
question's forward pass overlapped (services/query/context.py), the query thread lost ~3 ms to
it per question (p50 19.8 -> 17.3 ms together with that overlap). Ingest is unchanged within the
noise: 67.9, 66.5, 66.4 turns/s with one BLAS thread, 60.5 and 71.0 with two (benchmarks/ingest.py,
runs alternated).

An OPENBLAS_NUM_THREADS set in the environment is respected.
"""

from __future__ import annotations

import os
import threading

_done = threading.Event()


def single_threaded_blas() -> None:
    if _done.is_set() or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    from threadpoolctl import threadpool_limits

    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # BLAS libraries loaded later read it when they load
    threadpool_limits(limits=1, user_api="blas")  # the ones already loaded
    _done.set()
