"""The model cache writers: only a lost race may pass silently (issue 28's sharp edge).

A rename refused because a concurrent loader already published a complete
entry is harmless; a full disk or a permission error must raise, naming the
path, instead of returning a folder that does not exist."""

from __future__ import annotations

import errno
import os

import pytest

from unsee.impl.engines.files import publish_entry
from unsee.impl.engines.vllm.models import tiny_folder

DONE = "unsee-complete"


def refuse(code: int):
    def replace(src, dst):
        raise OSError(code, os.strerror(code), str(dst))

    return replace


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES])
def test_a_failed_write_raises_naming_the_entry(tmp_path, monkeypatch, code):
    monkeypatch.setattr(os, "replace", refuse(code))
    with pytest.raises(OSError, match="could not write the model cache entry") as info:
        tiny_folder(cache_dir=tmp_path)
    assert str(tmp_path) in str(info.value) and info.value.errno == code
    assert not any(p.name.startswith("vllm-tiny-") and (p / DONE).is_file() for p in tmp_path.iterdir())


def test_a_lost_race_is_the_winners_entry(tmp_path):
    entry, tmp = tmp_path / "entry", tmp_path / "tmp"
    for folder in (entry, tmp):
        folder.mkdir()
        (folder / DONE).write_text("done\n")
    (tmp / "weights").write_text("mine\n")
    publish_entry(tmp, entry, DONE)  # refused (the entry is not empty), and complete: no error
    assert (entry / DONE).is_file() and not (entry / "weights").exists()


def test_an_incomplete_entry_in_the_way_raises(tmp_path):
    entry, tmp = tmp_path / "entry", tmp_path / "tmp"
    entry.mkdir()
    (entry / "half-written").write_text("")
    tmp.mkdir()
    (tmp / DONE).write_text("done\n")
    with pytest.raises(OSError, match=str(entry)):
        publish_entry(tmp, entry, DONE)
