"""A llama.cpp sequence state blob, parsed into K and V rows by position (:class:`SeqKV`), and written back.

The blob layout: ``llama_context::state_seq_get_data`` writes u32 magic
(:data:`STATE_MAGIC`) and i32 seq_id (src/llama-context.cpp), then
``llama_kv_cache::state_write`` (src/llama-kv-cache.cpp; both vendored in the
llama-cpp-python sdist)::

    u32 n_stream; per stream: u32 cell_count; if > 0:
      per cell: i32 pos, u32 n_seq_id, i32 seq_id x n_seq_id
      u32 v_trans, u32 n_layer
      per layer: i32 k_type, u64 k_row_bytes, cell_count rows
      v_trans == 0: per layer: i32 v_type, u64 v_row_bytes, cell_count rows
      v_trans == 1: per layer: i32 v_type, u32 v_elem_bytes, u32 n_embd_v,
                    n_embd_v x cell_count elements (one row per channel)

A model with sliding-window layers has two KV caches in llama.cpp
(``llama_kv_cache_iswa``): the blob then holds two such sections after the
header, the full-attention layers' cache first (:class:`KVState`). Models
with M-RoPE or per-layer n-gram embeddings add a per-cell extension; the
parser refuses them rather than misreading. Needs numpy only.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

#: the first word of a sequence state blob (``io_magic`` in llama-context.cpp)
STATE_MAGIC = 0xAF143CD8


class BlobReader:
    """Reads a state blob front to back: little-endian fields, and rows as
    uint8 views of the blob (no copy)."""

    def __init__(self, blob: bytes):
        self.size = len(blob)
        self.offset = 0
        self._view = memoryview(blob)
        self._bytes = np.frombuffer(blob, dtype=np.uint8)

    def take(self, fmt: str) -> tuple:
        """The fields ``fmt`` (a struct format, little-endian) at the offset."""
        vals = struct.unpack_from("<" + fmt, self._view, self.offset)
        self.offset += struct.calcsize("<" + fmt)
        return vals

    def take_block(self, *shape: int) -> np.ndarray:
        """The bytes at the offset as a uint8 view of ``shape`` (e.g. rows x row bytes)."""
        size = math.prod(shape)
        block = self._bytes[self.offset:self.offset + size].reshape(shape)
        self.offset += size
        return block


def read_header(reader: BlobReader) -> None:
    """The blob's header: magic and sequence id."""
    magic, _seq = reader.take("Ii")
    if magic != STATE_MAGIC:
        raise ValueError(f"sequence state magic {magic:#x}, expected {STATE_MAGIC:#x}")


def read_stream_count(reader: BlobReader, streams: int = 1) -> None:
    """A cache section's start: its stream count, which must be the context's ``streams``."""
    (n_stream,) = reader.take("I")
    if n_stream != streams:
        raise ValueError(f"sequence state with {n_stream} KV streams; the context has {streams}")


def read_cell_count(reader: BlobReader) -> int:
    """A cache section's start (one stream): its cell count."""
    read_stream_count(reader)
    (cells,) = reader.take("I")
    return cells


def read_positions(reader: BlobReader, cells: int) -> np.ndarray:
    """Each cell's position, in cell order (one sequence id per cell)."""
    positions = np.empty(cells, dtype=np.int32)
    for i in range(cells):
        pos, n_seq = reader.take("iI")
        if n_seq != 1:
            raise ValueError(f"cell {i}: {n_seq} sequence ids in a one-sequence state")
        reader.take("i")  # the sequence id (a window read through sequence 1 has 1)
        positions[i] = pos
    return positions


def check_layers(reader: BlobReader, n_layer: int | None, v_trans: bool) -> int:
    """The section's V layout and layer count, which must be the context's
    (``n_layer`` None: any count); returns the count."""
    blob_v_trans, layers = reader.take("II")
    if (n_layer is not None and layers != n_layer) or bool(blob_v_trans) != v_trans:
        raise ValueError(f"state blob has {layers} layers, v_trans={blob_v_trans}; "
                         f"expected {n_layer}, {int(v_trans)}")
    return layers


def read_k(reader: BlobReader, cells: int, n_layer: int) -> tuple[list[np.ndarray], list[int]]:
    """Every layer's K rows (views of the blob) and ggml types."""
    ks, kt = [], []
    for _ in range(n_layer):
        t, row = reader.take("iQ")
        ks.append(reader.take_block(cells, row))
        kt.append(t)
    return ks, kt


def read_v(reader: BlobReader, cells: int, n_layer: int,
           v_trans: bool) -> tuple[list[np.ndarray], list[int], list[int]]:
    """Every layer's V rows by position, ggml types and element sizes (0
    where V is not transposed). Transposed V is stored channel-major; its
    position-major rows are a copy."""
    vs, vt, ve = [], [], []
    for _ in range(n_layer):
        if not v_trans:
            t, row = reader.take("iQ")
            vs.append(reader.take_block(cells, row))
            ve.append(0)
        else:
            t, el, n_embd = reader.take("iII")
            block = reader.take_block(n_embd, cells, el)
            vs.append(np.ascontiguousarray(block.transpose(1, 0, 2)).reshape(cells, n_embd * el))
            ve.append(el)
        vt.append(t)
    return vs, vt, ve


@dataclass(frozen=True)
class SeqKV:
    """One sequence's KV by position, parsed from its state blob.

    positions   int32 (n,), ascending
    k, v        per layer: uint8 (n, row_bytes), the row of each position
                (V un-transposed if the cache stores it transposed)
    k_types, v_types  ggml type ids per layer (part of the blob and the digest)
    v_trans     how the context stores V (to write a blob it will read back)
    v_elem      bytes per V element (for re-transposing)

    Arrays are never written to, so slices are shared safely."""

    positions: np.ndarray
    k: tuple[np.ndarray, ...]
    v: tuple[np.ndarray, ...]
    k_types: tuple[int, ...]
    v_types: tuple[int, ...]
    v_trans: bool
    v_elem: tuple[int, ...]

    @property
    def n(self) -> int:
        return int(self.positions.shape[0])

    @classmethod
    def empty(cls, n_layer: int, v_trans: bool, v_elem: tuple[int, ...] = ()) -> SeqKV:
        """No positions: what an empty sequence's blob parses to."""
        rows = np.zeros((0, 0), dtype=np.uint8)
        return cls(np.zeros(0, dtype=np.int32), (rows,) * n_layer, (rows,) * n_layer, (-1,) * n_layer,
                   (-1,) * n_layer, v_trans, v_elem or (0,) * n_layer)

    def head(self, n: int) -> SeqKV:
        """The first ``n`` positions (views, no copy)."""
        keep = int(np.searchsorted(self.positions, n))
        return SeqKV(self.positions[:keep], tuple(a[:keep] for a in self.k), tuple(a[:keep] for a in self.v),
                     self.k_types, self.v_types, self.v_trans, self.v_elem)

    def storages(self) -> dict:
        """Distinct host buffers held: ``{id(buffer): bytes}`` (a shared prefix counts once)."""
        out: dict = {}
        for a in (self.positions, *self.k, *self.v):
            while isinstance(a.base, np.ndarray):
                a = a.base
            owner = a if a.base is None else a.base  # an array, or the blob bytes it views
            out[id(owner)] = memoryview(owner).nbytes
        return out

    def digest_into(self, h) -> None:
        """Feed positions and every layer's K and V rows, by position, to ``h``."""
        order = np.argsort(self.positions, kind="stable")
        h.update(b"pos:" + np.ascontiguousarray(self.positions[order]).tobytes())
        for i, (k, t) in enumerate(zip(self.k, self.k_types)):
            h.update(f"{i}k:{t}:{k.shape[1]};".encode())
            h.update(np.ascontiguousarray(k[order]).tobytes())
        for i, (v, t) in enumerate(zip(self.v, self.v_types)):
            h.update(f"{i}v:{t}:{v.shape[1]};".encode())
            h.update(np.ascontiguousarray(v[order]).tobytes())

    @classmethod
    def parse(cls, blob: bytes, n_layer: int, v_trans: bool, v_elem: tuple[int, ...] = ()) -> SeqKV:
        """The rows of a one-cache sequence state blob (the module docstring
        has its layout), ordered by position; a ValueError for a blob of
        another layout, layer count or V storage than the context's."""
        reader = BlobReader(blob)
        read_header(reader)
        kv = cls.read_section(reader, n_layer, v_trans, v_elem)
        if reader.offset != reader.size:
            raise ValueError(f"state blob: {reader.size - reader.offset} bytes left unparsed (an unsupported layout)")
        return kv

    @classmethod
    def read_section(cls, reader: BlobReader, n_layer: int | None, v_trans: bool,
                     v_elem: tuple[int, ...] = ()) -> SeqKV:
        """One cache's section at the reader's offset (``n_layer`` None: any
        count; an empty section then has none)."""
        return cls.read_stream(reader, read_cell_count(reader), n_layer, v_trans, v_elem)

    @classmethod
    def read_stream(cls, reader: BlobReader, cells: int, n_layer: int | None, v_trans: bool,
                    v_elem: tuple[int, ...] = ()) -> SeqKV:
        """One stream's cells, after its cell count (``cells``)."""
        if cells == 0:
            return cls.empty(n_layer or 0, v_trans, v_elem)
        positions = read_positions(reader, cells)
        n_layer = check_layers(reader, n_layer, v_trans)
        ks, kt = read_k(reader, cells, n_layer)
        vs, vt, ve = read_v(reader, cells, n_layer, v_trans)
        # order positions ascending (a loaded or cropped cache keeps them so;
        # sort anyway so that `head` can cut by position)
        order = np.argsort(positions, kind="stable")
        if not np.array_equal(order, np.arange(cells)):
            positions = positions[order]
            ks = [k[order] for k in ks]
            vs = [v[order] for v in vs]
        return cls(positions, tuple(ks), tuple(vs), tuple(kt), tuple(vt), v_trans, tuple(ve))

    @classmethod
    def concat(cls, parts: list[SeqKV]) -> SeqKV:
        """The rows of ``parts`` (non-empty, of one layout, disjoint
        positions ascending part by part) as one (a copy)."""
        parts = [p for p in parts if p.n] or parts[:1]
        first = parts[0]
        if len(parts) == 1:
            return first
        return cls(np.concatenate([p.positions for p in parts]),
                   tuple(np.concatenate(rows) for rows in zip(*(p.k for p in parts))),
                   tuple(np.concatenate(rows) for rows in zip(*(p.v for p in parts))),
                   first.k_types, first.v_types, first.v_trans, first.v_elem)

    def to_blob(self) -> bytes:
        """The sequence state blob that loads these rows (cells in position order)."""
        return struct.pack("<Ii", STATE_MAGIC, 0) + self.section_bytes()

    def section_bytes(self) -> bytes:
        """This cache's section of a state blob (one stream, cells in position order)."""
        return struct.pack("<I", 1) + self.stream_bytes()

    def stream_bytes(self, seq: int = 0) -> bytes:
        """This cache's stream in a state blob: its cell count, then its cells in position order
        (each naming sequence ``seq``, as llama.cpp writes them; it reads them into the sequence
        it loads)."""
        parts = [struct.pack("<I", self.n)]
        if self.n == 0:
            return b"".join(parts)
        meta = np.zeros((self.n, 3), dtype=np.int32)  # pos, n_seq_id = 1, seq_id = 0
        meta[:, 0] = self.positions
        meta[:, 1] = 1
        meta[:, 2] = seq
        parts.append(meta.tobytes())
        parts.append(struct.pack("<II", int(self.v_trans), len(self.k)))
        for k, t in zip(self.k, self.k_types):
            parts.append(struct.pack("<iQ", t, k.shape[1]))
            parts.append(np.ascontiguousarray(k).tobytes())
        for v, t, el in zip(self.v, self.v_types, self.v_elem):
            if not self.v_trans:
                parts.append(struct.pack("<iQ", t, v.shape[1]))
                parts.append(np.ascontiguousarray(v).tobytes())
            else:
                n_embd = v.shape[1] // el
                parts.append(struct.pack("<iII", t, el, n_embd))
                parts.append(np.ascontiguousarray(v.reshape(self.n, n_embd, el).transpose(1, 0, 2)).tobytes())
        return b"".join(parts)


@dataclass(frozen=True)
class KVState:
    """A sequence's KV as llama.cpp keeps it: one cache, or for a model with
    sliding-window layers two (the full-attention layers' cache, then the
    sliding-window layers'), each a :class:`SeqKV` by position.

    llama.cpp's state writer gives a sliding-window cache's rows of the last
    ``n_swa`` positions only; the engine gathers the others
    (``LlamaCppEngine._read_swa_rows``), so that every cache here holds every
    position, and a prefix of any length is a slice (:meth:`head`)."""

    caches: tuple[SeqKV, ...]

    @property
    def n(self) -> int:
        return self.caches[0].n

    @classmethod
    def parse(cls, blob: bytes, n_layer: int, v_trans: bool, streams: int = 1) -> KVState:
        """Every cache section of a sequence state blob; their layers must add
        up to the model's ``n_layer``. A ValueError for any other layout.
        ``streams`` > 1: a context of a stream per sequence (``kv_unified``
        off, one cache), whose state writer gives every stream, the
        sequence's cells in one (:meth:`parse_streams`)."""
        if streams > 1:
            return cls.parse_streams(blob, n_layer, v_trans, streams)
        reader = BlobReader(blob)
        read_header(reader)
        caches = []
        while reader.offset < reader.size and len(caches) < 2:
            caches.append(SeqKV.read_section(reader, None, v_trans))
        if reader.offset != reader.size:
            raise ValueError(f"state blob: {reader.size - reader.offset} bytes left unparsed (an unsupported layout)")
        layers = sum(len(c.k) for c in caches if c.n)
        if any(c.n for c in caches) and layers != n_layer:
            raise ValueError(f"state blob has {layers} layers in {len(caches)} cache(s), v_trans={int(v_trans)}; "
                             f"expected {n_layer}, {int(v_trans)}")
        return cls(tuple(caches))

    @classmethod
    def parse_streams(cls, blob: bytes, n_layer: int, v_trans: bool, streams: int) -> KVState:
        """A one-cache state blob of ``streams`` streams, at most one holding cells."""
        reader = BlobReader(blob)
        read_header(reader)
        read_stream_count(reader, streams)
        found = [kv for kv in (SeqKV.read_stream(reader, reader.take("I")[0], None, v_trans)
                               for _ in range(streams)) if kv.n]
        if len(found) > 1 or reader.offset != reader.size:
            raise ValueError(f"a state of {streams} streams: the sequence's cells in {len(found)} of them, "
                             f"{reader.size - reader.offset} bytes left unparsed")
        if found and len(found[0].k) != n_layer:
            raise ValueError(f"state blob has {len(found[0].k)} layers; expected {n_layer}")
        return cls((found[0] if found else SeqKV.empty(n_layer, v_trans),))

    def head(self, n: int) -> KVState:
        return KVState(tuple(c.head(n) for c in self.caches))

    def with_cache(self, i: int, kv: SeqKV) -> KVState:
        """This state with cache ``i`` replaced by ``kv``."""
        return KVState(self.caches[:i] + (kv,) + self.caches[i + 1:])

    def storages(self) -> dict:
        out: dict = {}
        for c in self.caches:
            out.update(c.storages())
        return out

    def digest_into(self, h) -> None:
        """As :meth:`SeqKV.digest_into` for one cache (so one-cache digests are
        those of earlier versions); each cache tagged by its index for two."""
        if len(self.caches) == 1:
            self.caches[0].digest_into(h)
            return
        for i, c in enumerate(self.caches):
            h.update(f"cache{i};".encode())
            c.digest_into(h)

    def to_blob(self, streams: int = 1, stream: int = 0) -> bytes:
        """The state blob that loads these rows: one stream per cache, or (``streams`` > 1, one
        cache) every stream of a context of a stream per sequence, the cells in ``stream``."""
        if streams == 1:
            return struct.pack("<Ii", STATE_MAGIC, 0) + b"".join(c.section_bytes() for c in self.caches)
        if len(self.caches) != 1:
            raise ValueError("a state of several streams holds one cache (no sliding-window layers)")
        parts = [struct.pack("<IiI", STATE_MAGIC, stream, streams)]
        parts += [self.caches[0].stream_bytes(stream) if s == stream else struct.pack("<I", 0) for s in range(streams)]
        return b"".join(parts)


__all__ = ["STATE_MAGIC", "BlobReader", "KVState", "SeqKV"]
