"""``make gpu``'s page generator (bench/gpu.py) runs on the CPU with a tiny budget: the
parts a GPU machine runs (facts, calibration, forget == reset, timing) are tested here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_make_gpu_imports_this_tree_where_unsee_is_not_installed():
    """The GPU machine has no unsee installed, so ``make gpu`` maps the ``unsee`` namespace onto the
    folders with a path shim. It runs from the repo root, where ``./unsee/`` (only ``__init__.py``)
    would shadow the shim unless ``-P`` keeps the working directory off ``sys.path``: the first run
    on an H100 stopped there with "No module named 'unsee.bench'". ``-S`` leaves out site-packages,
    as the bare machine does not have this venv's editable install."""
    root = Path(__file__).resolve().parents[1]
    recipe = subprocess.run(["make", "-s", "-n", "gpu", f"GPU_PY={sys.executable} -S", "GPU_WHEELS=out/no-gpu-wheels"],
                            cwd=root, capture_output=True, text=True, check=True).stdout
    setup, _, run = recipe.strip().rpartition("\n")
    assert "-m unsee.bench.gpu" in run
    probe = run.split(" -m unsee.bench.gpu")[0] + " -c 'import unsee.bench as b; print(b.__path__[0])'"
    done = subprocess.run(["bash", "-c", f"{setup}\n{probe}"], cwd=root, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).as_posix().endswith("out/gpu-path/unsee/bench")
