"""``make gpu``'s page generator (bench/gpu.py) runs on the CPU with a tiny budget: the
parts a GPU machine runs (facts, calibration, forget == reset, timing) are tested here."""

from __future__ import annotations

from unsee.bench import gpu


def test_the_gpu_page_runs_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "gpu.md"
    argv = ["--device", "cpu", "--attns", "sdpa,flash_attention_2", "--dtypes", "bfloat16", "--examples", "1",
            "--prompts", "1", "--tokens", "6", "--context", "16", "--decode", "2", "--rounds", "1", "--out", str(out)]
    assert gpu.main(argv) == 0
    page = out.read_text()
    assert "**No GPU has run this page.**" in page
    assert "| flash_attention_2 | bfloat16 | not run: attn='flash_attention_2' runs on CUDA only" in page
    results = [line for line in page.splitlines() if line.startswith("| sdpa | bfloat16 |")]
    assert len(results) == 2  # a facts row and a results row
    facts, measured = (line.split(" | ") for line in results)
    assert facts[2] == "=" and facts[3] == "="  # the same chunking repeats; crop+continue == fresh
    assert "1 of 1" in measured[5] and float(measured[3]) > 0  # forget == reset; a positive calibrated bound
    assert "Command: `python -m unsee.bench.gpu --device cpu" in page
