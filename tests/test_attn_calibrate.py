"""The attention option (hf/attention.py) and calibrated draft bounds (engines/bounds.py,
``unsee calibrate``): clear errors, where the choice is recorded, and where a bound comes from."""

from __future__ import annotations

import json

import pytest

from unsee.impl.cli.main import main
from unsee.impl.engines import bounds
from unsee.impl.engines.hf import attention
from unsee.impl.engines.hf.models import load_model
from unsee.impl.engines.registry import make_engine
from unsee.impl.store.backend import LEGACY_ATTN, get_engine_meta, read_stored_engine
from unsee.impl.store.receipt import environment


@pytest.mark.parametrize("attn,device,dtype,message", [
    ("bogus", "cpu", "float32", "is not one of"),
    ("flash_attention_2", "cpu", "bfloat16", "runs on CUDA only"),
])
def test_a_bad_attention_is_refused_by_name(attn, device, dtype, message):
    with pytest.raises(ValueError, match=message) as err:
        load_model("tiny", device=device, dtype=dtype, attn=attn)
    assert repr(attn) in str(err.value)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_the_attention_is_loaded_and_recorded(attn):
    lm = load_model("tiny", attn=attn, dtype="bfloat16")
    assert lm.attn == attn == lm.model.config._attn_implementation
    assert f"attention {attn}" in lm.determinism
    engine = make_engine(lm)
    assert json.loads(get_engine_meta(engine)["engine_options"]) == {"attn": attn}
    assert environment(engine)["attn"] == attn
    assert engine.determinism.canonical_chunking == "turn"  # decode != prefill measured for every CPU attention


def test_the_default_is_ours_on_the_cpu_and_legacy_stores_keep_it():
    assert load_model("tiny").attn == attention.get_default_attn("cpu") == "unsee_eager"
    legacy = read_stored_engine({"model": "tiny", "dtype": "float32"})
    assert legacy.get_loader_options({"dtype": "float32"})["attn"] == LEGACY_ATTN == "unsee_eager"
    recorded = read_stored_engine({"model": "tiny", "dtype": "float32", "engine_options": '{"attn": "sdpa"}'})
    assert recorded.get_loader_options({"dtype": "float32"})["attn"] == "sdpa"


def test_unmeasured_configurations_get_the_conservative_facts():
    facts = attention.get_determinism_facts("cuda", "sdpa", "float16")
    assert not attention.is_measured("cuda", "sdpa", "float16")
    assert facts == dict(zip(("same_chunking_repeats", "crop_continue_is_fresh", "chunk_invariant",
                              "decode_is_prefill", "thread_invariant"), attention.UNMEASURED))


@pytest.mark.parametrize("measured,floor,bound", [(7.5e-5, 0, 1e-3), (2.2e-6, 0, 5e-5), (1.5e-6, 0, 2e-5),
                                                  (0.0, 0.031, 0.5), (1e-4, 0, 1e-3)])
def test_compute_bound_is_ten_times_the_larger_rounded_up(measured, floor, bound):
    assert bounds.compute_bound(measured, floor) == bound
    assert bound >= 10 * max(measured, floor)


def test_compute_bound_refuses_nothing_measured():
    with pytest.raises(ValueError, match="no positive bound"):
        bounds.compute_bound(0.0, 0.0)


def test_where_a_bound_comes_from(tmp_path):
    eager = make_engine(load_model("tiny", attn="eager", cache_dir=tmp_path))
    assert eager.draft_bound == 5e-5 and eager.draft_bound_source.startswith("measured: DRAFT_BOUNDS(")
    shipped_sdpa = make_engine(load_model("tiny", attn="sdpa", cache_dir=tmp_path))
    assert shipped_sdpa.draft_bound_source.startswith("measured: SDPA_DRAFT_BOUNDS('tiny', 'cpu', 'float32')")
    lm = load_model("tiny", attn="sdpa", dtype="bfloat16", cache_dir=tmp_path)  # no shipped row
    sdpa = make_engine(lm)
    assert sdpa.draft_bound is None and sdpa.draft_bound_source.startswith("none")
    key = bounds.get_key_of(lm)
    path = bounds.write_calibration(key, {"bound": 2e-5, "measured_max": 1e-6}, tmp_path)
    again = make_engine(lm)
    assert (again.draft_bound, again.draft_bound_source) == (2e-5, f"calibrated: {path}")
    path.write_text(path.read_text().replace('"sdpa"', '"eager"'))  # a file of another configuration
    with pytest.raises(ValueError, match="not a calibrated bound of"):
        make_engine(lm)


@pytest.mark.parametrize("options,message", [
    (["--attn", "bogus"], "attn='bogus'"),
    (["--threads", "0"], "--threads '0'"),
    (["--tokens", "1"], "--tokens 1"),
    (["--device", "tpu"], "device='tpu'"),
])
def test_calibrate_refuses_a_bad_configuration(tmp_path, capsys, options, message):
    assert main(["calibrate", "--model", "tiny", "--cache-dir", str(tmp_path), *options]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / bounds.BOUNDS_FOLDER).exists()


def test_calibrate_writes_the_bound_engines_then_use(tmp_path, capsys):
    args = ["calibrate", "--model", "tiny", "--dtype", "bfloat16", "--attn", "sdpa", "--prompts", "2",
            "--tokens", "12", "--threads", "1", "--cache-dir", str(tmp_path), "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bound"] >= 10 * max(out["measured_max"], out["resolution"]) and out["positions"] == 2 * (12 + 6)
    assert 0 <= out["decisions_clearing_threshold"] <= 1 and "margins" not in out
    engine = make_engine(load_model("tiny", dtype="bfloat16", attn="sdpa", cache_dir=tmp_path))
    assert (engine.draft_bound, engine.draft_bound_source) == (out["bound"], f"calibrated: {out['path']}")
