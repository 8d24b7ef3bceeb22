"""A lone decode step on every core with one thread's bits: ggml's key split, switched off.

llama.cpp's CPU flash attention computes a lone query row (a decode step of one
sequence) by splitting its keys among the threads once it attends over 512
cells or more, then summing the threads' partial results: the sum's order, so
the row's last bits, follow the thread count (docs/bench.md, "Decode on every
core"). Every other path computes a query row whole on one thread and spreads
the heads (and each matmul's output rows) among the threads instead, so its
bits are the same on any thread count. Without a switch, the engine fed a
multi-thread decode step as two rows (:func:`facts.forward_padded`), which
avoids the split but computes a second row: 1.84x the step's CPU.

The switch is a setter and one changed condition in the llama.cpp source that
llama-cpp-python vendors (:func:`patch_source`):
``ggml_cpu_set_flash_attn_split_kv(false)`` makes the lone row take the
whole-row path. Its bits are then one thread's
at any thread count (a thread computes the row as one thread does:
tests/test_llamacpp_threads.py), and nothing else changes: with the split on,
the rebuilt library's bits equal PyPI's build's.

``make install`` (and ``make test``) builds that library from the pinned
llama-cpp-python's source and puts it in the venv (``python -m
unsee.impl.engines.llamacpp.kernels install``: the sdist from PyPI, the
patch, ``cmake`` for the ``ggml-cpu`` target alone: 40 s on 2 cores, the
sdist's download included). A llama-cpp-python without it (``pip install 'unsee[llamacpp]'``
alone) keeps the padded step: :func:`set_lone_row_split` says which.

The same build carries a second switch, for the matmul (repack.py): repacked
Q4_K weights whose batched kernel sums each row as the one-row kernel does, so
a decode step runs llama.cpp's repacked (fast) kernel and still equals the rows
a prefill writes (:func:`set_repack_row_order`).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from unsee.impl.engines.llamacpp.repack import REPACK, ROW_ORDER_SETTER, X86_REPACK, patch_repack, patch_repack_types

#: the function the patch adds to ggml's CPU backend
SETTER = "ggml_cpu_set_flash_attn_split_kv"
#: the source file the patch changes, under the vendored llama.cpp
OPS = Path("ggml/src/ggml-cpu/ops.cpp")
#: where the split is decided, as llama-cpp-python 0.3.36's llama.cpp writes it
SPLIT_DECISION = "const bool use_split_kv_path = !use_ref && (neq1 == 1 && neq3 == 1)"
SWITCH = """// unsee: whether a lone query row's keys are split among the threads (the split-KV path of
// ggml_compute_forward_flash_attn_ext_f16). The split's sum follows the thread count; off, the
// row is computed whole by one thread, as on one thread, and its heads are spread instead.
static std::atomic<bool> ggml_cpu_fa_split_kv{true};

extern "C" {
GGML_BACKEND_API void ggml_cpu_set_flash_attn_split_kv(bool enabled);
}

void ggml_cpu_set_flash_attn_split_kv(bool enabled) {
    ggml_cpu_fa_split_kv.store(enabled, std::memory_order_relaxed);
}

"""
#: the function the switch is put before (it must precede the split's use)
ANCHOR = "static void ggml_compute_forward_flash_attn_ext_tiled("
#: cmake flags of the rebuilt library where $CMAKE_ARGS names none (the Makefile's build of
#: llama-cpp-python: a generic x86-64 CPU, not this machine's)
DEFAULT_CMAKE_ARGS = "-DGGML_NATIVE=OFF"
BUILD_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
               "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF")

_STATE: dict = {}


def patch_source(text: str) -> str:
    """``ops.cpp`` with the switch: the setter before the flash attention kernels, and the split
    taken only while it is on. A ValueError where the source is not the one the patch was
    written for (another llama.cpp), naming what it did not find."""
    for needle in (SPLIT_DECISION, ANCHOR, "#include <algorithm>"):
        if text.count(needle) != 1:
            raise ValueError(f"{OPS}: expected {needle!r} once, found it {text.count(needle)} times "
                             "(another llama.cpp than llama-cpp-python 0.3.36 vendors?)")
    text = text.replace("#include <algorithm>", "#include <algorithm>\n#include <atomic>")
    text = text.replace(ANCHOR, SWITCH + ANCHOR)
    return text.replace(SPLIT_DECISION, SPLIT_DECISION.replace(
        "!use_ref &&", "!use_ref && ggml_cpu_fa_split_kv.load(std::memory_order_relaxed) &&"))


def get_cpu_libraries(lc) -> list[Path]:
    """The files of the ggml CPU backend beside ``lc`` (the ``llama_cpp`` module): a wheel holds
    one copy per name (``libggml-cpu.so``, ``.so.0``, ...), no links."""
    return sorted(p for p in (Path(lc.__file__).parent / "lib").glob("libggml-cpu.*") if p.is_file())


def get_loaded_cpu_library(lc) -> Path | None:
    """The CPU backend file this process mapped (Linux's /proc/self/maps: llama.cpp loads one of
    the names by its soname, and a copy under another name would be a second, unused instance),
    else the first of :func:`get_cpu_libraries`, or None."""
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split(maxsplit=5)[-1]
            if Path(path).name.startswith("libggml-cpu."):
                return Path(path)
    except OSError:
        pass
    found = get_cpu_libraries(lc)
    return found[0] if found else None


def find_setter(lc, name: str = SETTER):
    """The switch ``name``'s function in the CPU library llama.cpp computes with (the same
    instance: the loader maps a file once), or None where the library has none."""
    path = get_loaded_cpu_library(lc)
    if path is None:
        return None
    try:
        setter = getattr(ctypes.CDLL(str(path)), name)
    except (OSError, AttributeError):
        return None
    setter.argtypes, setter.restype = [ctypes.c_bool], (ctypes.c_bool if name == ROW_ORDER_SETTER else None)
    return setter


def has_switches(lc) -> bool:
    """Whether the library has both of this module's switches (the build of :func:`build`)."""
    return find_setter(lc) is not None and find_setter(lc, ROW_ORDER_SETTER) is not None


def set_lone_row_split(lc, enabled: bool = False) -> bool:
    """Switch the lone row's key split (process-wide, as ggml reads it); whether the library
    has the switch. Off, a decode step's bits are one thread's on any thread count."""
    setter = find_setter(lc)
    if setter is not None:
        setter(enabled)
        _STATE["split"] = enabled
    return setter is not None


def set_repack_row_order(lc, enabled: bool) -> bool:
    """Switch the repacked Q4_K gemm's row order (repack.py; process-wide, read at load, which
    types are repacked, and at every matmul); whether it took effect (False: the library lacks
    the switch, or its gemm is not the one the patch rewrites)."""
    setter = find_setter(lc, ROW_ORDER_SETTER)
    return bool(setter is not None and setter(enabled))


def is_lone_row_exact() -> bool:
    """Whether a one-row forward on several threads has one thread's bits in this process (the
    split switched off): then a decode step needs no padding row."""
    return _STATE.get("split") is False


# --------------------------------------------------------------- the build


def say(text: str) -> None:
    print(f"kernels: {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def build(work: Path, version: str) -> Path:
    """The patched CPU library of llama-cpp-python ``version``, built under ``work``: its sdist
    from PyPI (kept there and reused), the patch, cmake's ``ggml-cpu`` target."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("cmake is not on PATH (`pip install cmake` or the system's package)")
    work.mkdir(parents=True, exist_ok=True)
    sdist = work / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.is_file():
        say(f"fetching llama-cpp-python {version}'s source from PyPI")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        f"llama-cpp-python=={version}", "-d", str(work)], check=True)
    source = work / f"llama_cpp_python-{version}"
    shutil.rmtree(source, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(work, filter="data")
    llama = source / "vendor" / "llama.cpp"
    for part, patch in ((OPS, patch_source), (REPACK, patch_repack_types), (X86_REPACK, patch_repack)):
        (llama / part).write_text(patch((llama / part).read_text()))
    out = work / "build"
    flags = shlex.split(os.environ.get("CMAKE_ARGS") or DEFAULT_CMAKE_ARGS)
    say(f"building ggml-cpu with {' '.join(BUILD_FLAGS + tuple(flags))}")
    started = time.monotonic()
    subprocess.run([cmake, "-S", str(llama), "-B", str(out), *BUILD_FLAGS, *flags], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([cmake, "--build", str(out), "--target", "ggml-cpu", "-j", str(os.cpu_count() or 1)],
                   check=True, stdout=subprocess.DEVNULL)
    say(f"built in {time.monotonic() - started:.0f} s")
    built = sorted((out / "bin").glob("libggml-cpu.*"))
    if not built:
        raise RuntimeError(f"cmake built no libggml-cpu under {out / 'bin'}")
    return built[0].resolve()


def install(built: Path, targets: list[Path]) -> None:
    """Put ``built`` in place of each of ``targets`` (the files their links name), atomically."""
    for real in {t.resolve() for t in targets}:
        fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=".libggml-cpu-")
        os.close(fd)
        shutil.copy2(built, tmp)
        os.replace(tmp, real)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unsee.impl.engines.llamacpp.kernels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["install", "status"],
                        help="install: build the switches into this environment's llama-cpp-python; "
                             "status: say whether it has them")
    parser.add_argument("--work", default="out/llama-kernels", help="where the source is fetched and built")
    parser.add_argument("--force", action="store_true", help="build again where the library has the switch")
    args = parser.parse_args(argv)
    try:
        import llama_cpp as lc
    except ImportError as e:
        print(f"llama-cpp-python is not installed here ({e}): pip install 'unsee[llamacpp]' first", file=sys.stderr)
        return 1
    targets = get_cpu_libraries(lc)
    has = has_switches(lc)
    if args.command == "status" or (has and not args.force):
        print(f"{get_loaded_cpu_library(lc)}: {'has' if has else 'lacks'} {SETTER} and {ROW_ORDER_SETTER}")
        return 0
    if not targets:
        print(f"no libggml-cpu beside {lc.__file__}: this llama-cpp-python is built otherwise", file=sys.stderr)
        return 1
    install(build(Path(args.work), lc.__version__), targets)
    check = subprocess.run([sys.executable, "-m", "unsee.impl.engines.llamacpp.kernels", "status"],
                           check=False, capture_output=True, text=True)
    print(check.stdout.strip())
    return 0 if f": has {SETTER}" in check.stdout else 1


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["SETTER", "build", "find_setter", "get_cpu_libraries", "get_loaded_cpu_library", "has_switches", "install",
           "is_lone_row_exact", "patch_source", "set_lone_row_split", "set_repack_row_order"]
