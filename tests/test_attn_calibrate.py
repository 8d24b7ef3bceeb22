"""The attention option (hf/attention.py) and calibrated draft bounds (engines/bounds.py,
``unsee calibrate``): clear errors, where the choice is recorded, and where a bound comes from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unsee.impl.cli.main import main
from unsee.impl.engines import bounds
from unsee.impl.engines.hf import attention
from unsee.impl.engines.hf.models import load_model
from unsee.impl.engines.registry import make_engine
from unsee.impl.store.backend import LEGACY_ATTN, get_engine_meta, read_stored_engine
from unsee.impl.store.receipt import environment

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "secret_in_tool_result.json"


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
    assert f"attention {attn}" in lm.determinism_statement
    engine = make_engine(lm)
    assert json.loads(get_engine_meta(engine)["engine_options"]) == {"attn": attn}
    assert environment(engine)["attn"] == attn
    assert engine.determinism.canonical_chunking == "turn"  # decode != prefill measured for every CPU attention


def test_the_default_is_sdpa_on_the_cpu_and_legacy_stores_keep_ours():
    assert load_model("tiny").attn == attention.get_default_attn("cpu") == "sdpa"
    assert attention.get_default_attn("cuda") == "unsee_eager"  # nothing measured on CUDA here
    legacy = read_stored_engine({"model": "tiny", "dtype": "float32"})
    assert legacy.get_loader_options({"dtype": "float32"})["attn"] == LEGACY_ATTN == "unsee_eager"
    recorded = read_stored_engine({"model": "tiny", "dtype": "float32", "engine_options": '{"attn": "sdpa"}'})
    assert recorded.get_loader_options({"dtype": "float32"})["attn"] == "sdpa"


def test_a_family_without_the_default_falls_back_to_ours():
    """Gemma 2's soft-capped attention has no sdpa path in transformers: the default
    loads it with ours; naming sdpa for it is transformers' error, naming the class."""
    assert load_model("tiny-gemma2").attn == "unsee_eager"
    assert "attention unsee_eager" in load_model("tiny-gemma2").determinism_statement
    with pytest.raises(ValueError, match="Gemma2ForCausalLM"):
        load_model("tiny-gemma2", attn="sdpa")


def test_a_session_stored_before_the_switch_rebuilds_with_its_attention(tmp_path, capsys):
    """A store written under the old default (``unsee_eager`` recorded, or no
    ``engine_options`` at all, from before ``--attn``) is rebuilt with ours, not
    with today's default: its KV bits, and so its digests, are ours'."""
    import sqlite3

    from unsee.impl.store.backend import load_stored_engine
    from unsee.impl.store.sqlite import SessionStore

    path = tmp_path / "old.db"
    assert main(["run", str(EXAMPLE), "--model", "tiny", "--attn", "unsee_eager",
                 "--store", str(path)]) == 0
    capsys.readouterr()
    with SessionStore.open(path) as store:
        meta = store.get_meta()
    assert json.loads(meta["engine_options"]) == {"attn": "unsee_eager"}
    assert load_stored_engine(meta).lm.attn == "unsee_eager"
    with sqlite3.connect(path) as conn:  # as a store from before --attn: no engine record at all
        conn.execute("DELETE FROM meta WHERE key IN ('backend', 'model_ref', 'engine_options')")
    legacy = {key: value for key, value in meta.items() if key not in ("backend", "model_ref", "engine_options")}
    assert load_stored_engine(legacy).lm.attn == "unsee_eager" != attention.get_default_attn("cpu")
    assert main(["show", str(path), "--json", "--model", "tiny"]) == 0
    assert json.loads(capsys.readouterr().out)["verified"]  # its digest rebuilt, bit for bit


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


def test_the_help_says_the_default(capsys):
    """``--attn``'s help names each device's default (options.ATTN_DEFAULT_HELP is
    written out so that ``unsee --help`` loads no transformers; this keeps it true)."""
    from unsee.impl.cli.options import ATTN_DEFAULT_HELP

    for kind, name in attention.DEFAULT_ATTN.items():
        assert f"{name} on {kind}" in ATTN_DEFAULT_HELP
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "sdpa on cpu" in " ".join(capsys.readouterr().out.split())


def test_a_bound_calibrated_here_wins_over_a_shipped_one(tmp_path):
    """A shipped row was measured on another machine; where it does not hold on
    this CPU, `unsee calibrate` writes one measured here, and that one is in force."""
    from unsee.impl.engines.bounds import get_bound, get_key_of, write_calibration

    lm = load_model("tiny", attn="sdpa", cache_dir=tmp_path)
    shipped, source = get_bound(get_key_of(lm), lm.name, tmp_path)
    assert shipped is not None and "shipped, measured on another machine" in source
    key = get_key_of(lm)
    assert key.cpu  # the instruction set this CPU runs the kernels with (files.get_cpu_isa)
    path = write_calibration(key, {"bound": shipped * 4}, tmp_path)
    assert get_bound(key, lm.name, tmp_path) == (shipped * 4, f"calibrated: {path}")
    assert make_engine(load_model("tiny", attn="sdpa", cache_dir=tmp_path)).draft_bound == shipped * 4


def test_the_cpu_instruction_set_is_read_from_the_flags():
    from unsee.impl.engines.files import get_cpu_isa

    assert get_cpu_isa("flags\t\t: fpu sse2 avx2 avx512f\n") == "avx512"
    assert get_cpu_isa("flags\t\t: fpu sse2 avx2\n") == "avx2"
    assert get_cpu_isa("Features\t: fp asimd\n") == "neon"
