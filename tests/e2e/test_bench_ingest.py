"""`memstream bench ingest`: the append rate, one LoCoMo conversation's add -> ready with
the time per stage, and each model alone on the same turns, on the declared fast model path. It
checks the output and the command's errors, not the figures (docs/results/ingest.md: those come from the full run
with the real models)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.e2e.fast_processes import BIN, env

pytestmark = pytest.mark.e2e


def _bench(tmp_path, *args):
    e = {**env(tmp_path / "unused"), "MEMSTREAM_ENCODER_MODEL": "hashing", "MEMSTREAM_NER_MODEL": "lexicon"}
    return subprocess.run([str(BIN), "bench", "ingest", *args], env=e, capture_output=True, text=True, timeout=900)


def test_bench_ingest_reports_rates_stages_and_the_models_alone(tmp_path, locomo):
    out, png = tmp_path / "ingest.json", tmp_path / "ingest.png"
    run = _bench(tmp_path, "--locomo", str(locomo), "--conversations", "conv-26", "--append-events", "500",
                 "--out", str(out), "--plot", str(png))
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["append"]["events"] == 500 and r["append"]["append_events_per_s"] > 0 and r["append"]["validate_and_append_events_per_s"] > 0
    a = r["add_to_ready"]
    assert a["turns"] == 419 and a["conversations"] == ["conv-26"]
    assert 0 < a["append_seconds"] <= a["process_seconds"] <= a["ready_seconds"]
    assert a["turns_per_second"] == pytest.approx(a["turns"] / a["ready_seconds"], rel=0.01)
    stages = a["stage_seconds"]
    for view in ("lexical", "dense", "graph", "hierarchy"):
        assert stages[f"{view}: store writes"] > 0 and stages[f"{view}: projection, models included"] > 0
    assert stages["encoder: turns + sentences (dense)"] > 0 and stages["ner (graph)"] > 0
    assert a["models_alone"]["encoder_turns_per_s"] > 0 and a["models_alone"]["ner_turns_per_s"] > 0
    assert a["pipeline_to_slower_model"] == pytest.approx(a["turns_per_second"] / min(a["models_alone"].values()), rel=0.02)
    assert set(a["models_alone_cores_used"]) == {"encoder", "ner"} and all(c > 0 for c in a["models_alone_cores_used"].values())
    serial = 1 / sum(1 / v for v in a["models_alone"].values())
    assert a["pipeline_to_models_in_sequence"] == pytest.approx(a["turns_per_second"] / serial, rel=0.02)
    assert png.stat().st_size > 0 and r["command"].startswith("memstream bench ingest")


@pytest.mark.parametrize("args, message", [(("--locomo", "/nonexistent.json"), "no LoCoMo file"),
                                           (("--append-events", "0"), "positive"),
                                           (("--conversations", "conv-nope", "--append-events", "10"), "none of ['conv-nope']")])
def test_bench_ingest_refuses_bad_options_with_a_clear_error(tmp_path, locomo, args, message):
    run = _bench(tmp_path, "--locomo", str(locomo), *args, "--out", str(tmp_path / "i.json"))
    assert run.returncode != 0 and message in run.stderr and "Traceback" not in run.stderr and not (tmp_path / "i.json").exists()
