"""Repacked Q4_K weights that sum a row as a decode step does: the patch to ggml's CPU repack.

llama.cpp repacks a Q4_K matrix at load (8 rows interleaved) and multiplies it
by one activation row with a *gemv* kernel, by four or more with a *gemm* kernel
(x86: ``ggml/src/ggml-cpu/arch/x86/repack.cpp``). Both compute the same integer
dot products per 32-weight sub-block; they differ in when those become floats:

- the gemv adds a super-block's 8 sub-blocks as integers, then makes one
  fused multiply-add per super-block (``acc = fma(float(sum), d_w * d_x, acc)``);
- the gemm makes one per pair of sub-blocks, 4 per super-block.

So a prefill's row and a decode step's row differ in their last bits, and the
engine kept the file's layout instead (per-row ``vec_dot`` for every batch
size: docs/engines.md, "Exact kernels"), which decodes about 1.2x slower than
the repacked gemv on Qwen2.5 1.5B Q4_K_M (docs/bench.md).

The patch adds a switch, ``ggml_cpu_set_repack_row_order(bool)``, off by
default. On, the AVX2 gemm keeps each sub-block pair's integer sum, adds the
super-block's as integers, and makes the gemv's one multiply-add per
super-block with the same operands: every output is then the gemv's, bit for
bit, whatever the batch (the integer sums are exact: at most 8 x 32 x 15 x 127
x 63 in magnitude). Only Q4_K is repacked while it is on (every other type
keeps the file's layout and its per-row kernels), and the setter refuses where
the build's gemm is not the AVX2 one this patch rewrites (an AVX-512 build)
or has none (not x86). The q8_K quantization of 4 rows at a time and of one
row give the same integers and scales, up to a sign flip of both where a
block's largest magnitude is taken by both signs, which cancels exactly.

The functions here are pure text edits of the two sources, each refusing a
source it was not written for (another llama.cpp) and naming what it missed;
:mod:`kernels` applies them when it builds the library.
"""

from __future__ import annotations

import re
from pathlib import Path

#: the function the switch adds to ggml's CPU backend (returns whether it took effect)
ROW_ORDER_SETTER = "ggml_cpu_set_repack_row_order"
#: the x86 kernels (the gemm rewritten) and the repack type choice (the switch, the type filter)
X86_REPACK = Path("ggml/src/ggml-cpu/arch/x86/repack.cpp")
REPACK = Path("ggml/src/ggml-cpu/repack.cpp")
GEMM = "void ggml_gemm_q4_K_8x8_q8_K("
GEMM_END = "void ggml_gemm_iq4_nl_8x8_q8_0("
#: the AVX2 gemm's two row loops: 16 activation rows at a time, then 4
LOOP_16 = "    for (; y < anr / 4; y += 4) {\n"
LOOP_4 = "    for (; y < nr / 4; y++) {\n"
B_LOOP = "            for (int64_t b = 0; b < nb; b++) {\n"
#: the end of a super-block's sub-block loop, before the rows are stored
SB_END = re.compile(r"\n                }\n(            }\n\n?            // Store the accumulated values\n)")
#: a sub-block pair's multiply-add into a row's accumulator (or its mins')
FMA = re.compile(r"^ +(acc_(?:min_)?rows)\[(rp \* 4(?: \+ \d)?|\d)\] = _mm256_fmadd_ps\(_mm256_cvtepi32_ps\((\w+)\), "
                 r"(_mm256_mul_ps\(col_(?:scale|dmin)_f32, _mm256_shuffle_ps\(row_scale_f32, row_scale_f32, \d+\)\)), "
                 r"\1\[\2\]\);$", re.MULTILINE)
X86_INCLUDE = '#include "../../repack.h"\n'
REPACK_INCLUDE = '#include "repack.h"\n'
PICK = ("static const ggml::cpu::tensor_traits * ggml_repack_get_optimal_repack_type("
        "const struct ggml_tensor * cur) {\n")
SWITCH = f"""#include <atomic>
// unsee: on, the Q4_K gemm sums each row in the gemv's order and only Q4_K is repacked
std::atomic<bool> ggml_cpu_repack_row_order{{false}};

extern "C" {{
GGML_BACKEND_API bool {ROW_ORDER_SETTER}(bool enabled);
}}

bool {ROW_ORDER_SETTER}(bool enabled) {{
#if defined(__AVX2__) && !(defined(__AVX512BW__) && defined(__AVX512DQ__))
    ggml_cpu_repack_row_order.store(enabled, std::memory_order_relaxed);
    return true;
#else
    return !enabled;  // this build's Q4_K gemm is not the one the patch rewrites
#endif
}}

"""
TYPE_FILTER = ("    if (ggml_cpu_repack_row_order.load(std::memory_order_relaxed) && cur->type != GGML_TYPE_Q4_K) {\n"
               "        return nullptr;  // unsee: the file's layout, per-row kernels\n    }\n")


def need(text: str, needle: str, where: object, count: int = 1) -> None:
    """A ValueError naming ``where`` unless ``needle`` occurs ``count`` times in ``text``."""
    if text.count(needle) != count:
        raise ValueError(f"{where}: expected {needle.strip()[:70]!r} {count} time(s), found it "
                         f"{text.count(needle)} (another llama.cpp than llama-cpp-python 0.3.36 vendors?)")


def patch_repack_types(text: str) -> str:
    """``repack.cpp`` with the switch (off by default) and, while it is on, Q4_K the only type repacked."""
    need(text, REPACK_INCLUDE, REPACK)
    need(text, PICK, REPACK)
    return text.replace(REPACK_INCLUDE, REPACK_INCLUDE + SWITCH).replace(PICK, PICK + TYPE_FILTER)


def patch_repack(text: str) -> str:
    """The x86 ``repack.cpp`` whose Q4_K gemm, with the switch on, sums rows as the gemv does
    (module docstring): both AVX2 row loops rewritten by :func:`order_rows`."""
    need(text, GEMM, X86_REPACK)
    need(text, GEMM_END, X86_REPACK)
    need(text, X86_INCLUDE, X86_REPACK)
    start, end = text.index(GEMM), text.index(GEMM_END)
    head, sep, loops = text[start:end].rpartition(LOOP_16)
    need(loops, LOOP_4, f"{GEMM} after its last 16-row loop")
    rows_16, rows_4 = loops.split(LOOP_4)
    head = head.replace("    int anr = ", "    const bool row_order = ggml_cpu_repack_row_order.load(std::memory_order_relaxed);\n"
                                         "    int anr = ", 1)
    gemm = (head + sep + order_rows(rows_16, 16, "a_ptrs[rp][b].d") + LOOP_4
            + order_rows(rows_4, 4, "a_ptr[b].d"))
    text = text[:start] + gemm + text[end:]
    return text.replace(X86_INCLUDE, X86_INCLUDE + "#include <atomic>\nextern std::atomic<bool> ggml_cpu_repack_row_order;\n")


def order_rows(loop: str, rows: int, row_scales: str) -> str:
    """One row loop of the gemm with the switch's branch: each sub-block pair's integer sums kept
    (``isum_rows``, ``isum_min_rows``) in place of its multiply-adds, and after the sub-block
    loop one multiply-add per super-block and row, the gemv's operands in the gemv's order."""
    fmas = FMA.findall(loop)
    if len(fmas) != 8 or len(SB_END.findall(loop)) != 1:
        raise ValueError(f"{GEMM}: a {rows}-row loop with {len(fmas)} multiply-adds (expected 8) "
                         f"and {len(SB_END.findall(loop))} sub-block loop ends (expected 1)")
    need(loop, B_LOOP, f"{GEMM}'s {rows}-row loop")
    need(loop, f"_mm_load_ps({row_scales})", f"{GEMM}'s {rows}-row loop")

    def keep_sum(match: re.Match) -> str:
        acc, row, value, _ = match.groups()
        pad = match.group(0)[:len(match.group(0)) - len(match.group(0).lstrip())]
        return (f"{pad}if (row_order) {{ {get_sums(acc)}[{row}] = _mm256_add_epi32({get_sums(acc)}[{row}], {value}); }} "
                f"else {{ {match.group(0).strip()} }}")

    zero = (f"                __m256i isum_rows[{rows}], isum_min_rows[{rows}];\n"
            f"                for (int i = 0; i < {rows}; i++) {{\n"
            "                    isum_rows[i] = _mm256_setzero_si256();\n"
            "                    isum_min_rows[i] = _mm256_setzero_si256();\n                }\n")
    adds = "".join(f"                    {acc}[{row}] = _mm256_fmadd_ps(_mm256_cvtepi32_ps({get_sums(acc)}[{row}]), "
                   f"{scale}, {acc}[{row}]);\n" for acc, row, _, scale in fmas)
    scale = (f"                    const __m128 row_scale_f32_sse = _mm_load_ps({row_scales});\n"
             "                    const __m256 row_scale_f32 = _mm256_set_m128(row_scale_f32_sse, row_scale_f32_sse);\n")
    once = (scale + adds if rows == 4 else
            "                    for (int rp = 0; rp < 4; rp++) {\n" + indent(scale + adds) + "                    }\n")
    loop = FMA.sub(keep_sum, loop).replace(B_LOOP, B_LOOP + zero, 1)
    return SB_END.sub(lambda m: "\n                }\n                if (row_order) {\n" + once + "                }\n"
                      + m.group(1), loop)


def get_sums(acc: str) -> str:
    """The integer sums a row accumulator (``acc_rows`` or ``acc_min_rows``) is fed from."""
    return "isum_rows" if acc == "acc_rows" else "isum_min_rows"


def indent(block: str) -> str:
    return "".join("    " + line for line in block.splitlines(keepends=True))


__all__ = ["REPACK", "ROW_ORDER_SETTER", "X86_REPACK", "order_rows", "patch_repack", "patch_repack_types"]
