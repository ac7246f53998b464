"""GGUFFile validation: every malformed, truncated or hostile file gives a GGUFError naming the problem, fast and
without big allocations; the real Gemma 3 270M file reads exactly like gguf-py's GGUFReader."""
import struct
import time
import tracemalloc

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bolt_ros.engine.default_models import resolve_model
from bolt_ros.engine.gguf.reader import GGUFError, GGUFFile, torch_shape

# --- a byte-level GGUF builder (so tests can write what no sane writer would) -------------------------------------


def s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def kv_u32(key: str, v: int) -> bytes:
    return kv(key, 4, struct.pack("<I", v))


def kv_str(key: str, v: str) -> bytes:
    return kv(key, 8, s(v))


def kv_arr(key: str, etype: int, count: int, body: bytes) -> bytes:
    return kv(key, 9, struct.pack("<IQ", etype, count) + body)


def ti(name: str, shape: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    return s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape) + struct.pack(
        "<IQ", ggml_type, offset)


def build(kvs: list[bytes], tis: list[bytes], data: bytes = b"", *, version: int = 3, magic: bytes = b"GGUF",
          n_kv: int | None = None, n_tensors: int | None = None, align: int = 32) -> bytes:
    head = magic + struct.pack("<IQQ", version, len(tis) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tis)
    body += b"\0" * (-len(body) % align)
    return body + data


def good_parts():
    """A small valid file: scalars, a string array, a float array, two F32 tensors and a Q8_0 tensor."""
    kvs = [kv_str("general.architecture", "llama"), kv_u32("llama.block_count", 2),
           kv_arr("tokenizer.ggml.tokens", 8, 3, s("a") + s("bé") + s("<x>")),
           kv_arr("tokenizer.ggml.scores", 6, 3, np.array([0, -1, -2], np.float32).tobytes()),
           kv("general.flag", 7, b"\x01")]
    t0 = np.arange(8, dtype=np.float32)
    t1 = np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5
    q = np.zeros(34, np.uint8)  # one Q8_0 block: f16 scale 1.0 then 32 int8
    q[0:2] = np.array([1.0], np.float16).view(np.uint8)
    q[2:] = np.arange(32, dtype=np.int8).view(np.uint8)
    tis = [ti("a.weight", (8,), 0, 0), ti("b.weight", (3, 2), 0, 32), ti("q.weight", (32,), 8, 64)]
    data = t0.tobytes() + t1.tobytes() + b"\0" * 8 + q.tobytes()
    return kvs, tis, data


def write(tmp_path, blob: bytes, name="x.gguf"):
    p = tmp_path / name
    p.write_bytes(blob)
    return p


@pytest.fixture
def good(tmp_path):
    return write(tmp_path, build(*good_parts()))


def expect_error(path, match: str):
    """GGUFError matching `match`, in well under a second, allocating under 4 MiB."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(GGUFError, match=match):
            GGUFFile(path)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 1.0
    assert peak < 4 << 20, peak


# --- the happy path ---------------------------------------------------------------------------------------------


def test_small_file_reads_back(good):
    with GGUFFile(good) as gf:
        assert gf.version == 3 and gf.alignment == 32 and gf.arch() == "llama"
        assert gf.metadata["tokenizer.ggml.tokens"] == ["a", "bé", "<x>"]
        blob, offsets = gf.metadata["tokenizer.ggml.tokens"].buffers()  # the validators' vectorized view
        assert blob.tobytes() == "abé<x>".encode() and offsets.tolist() == [0, 1, 4, 7]
        np.testing.assert_array_equal(gf.metadata["tokenizer.ggml.scores"], [0, -1, -2])
        assert gf.metadata["general.flag"] is True and gf.metadata["llama.block_count"] == 2
        assert list(gf.tensors) == ["a.weight", "b.weight", "q.weight"]
        b = gf.tensors["b.weight"]
        assert b.shape == (3, 2) and torch_shape(b) == (2, 3) and b.nbytes == 24
        np.testing.assert_array_equal(gf.raw("b.weight").view(np.float32), np.arange(6) * 0.5)
        assert gf.tensors["q.weight"].nbytes == 34
        raw = gf.raw("a.weight")
        assert not raw.flags.writeable
        with pytest.raises(GGUFError, match="missing tensor 'nope'"):
            gf.raw("nope")


def test_missing_file(tmp_path):
    with pytest.raises(GGUFError, match="cannot open"):
        GGUFFile(tmp_path / "absent.gguf")


# --- header -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("magic", [b"GGUG", b"\0\0\0\0", b"FUGG"])
def test_bad_magic(tmp_path, magic):
    expect_error(write(tmp_path, build(*good_parts(), magic=magic)), "not a GGUF file")


@pytest.mark.parametrize("version", [0, 1, 4, 0x03000000, 2**32 - 1])
def test_bad_version(tmp_path, version):
    expect_error(write(tmp_path, build(*good_parts(), version=version)), f"unsupported GGUF version {version}")


def test_big_endian_hint(tmp_path):
    expect_error(write(tmp_path, build(*good_parts(), version=0x03000000)), "big-endian")


def test_too_small(tmp_path):
    expect_error(write(tmp_path, b"GGUF\3\0\0\0"), "too small")


@pytest.mark.parametrize("n_kv,n_tensors", [(2**62, 0), (0, 2**40), (2**64 - 1, 2**64 - 1), (10**6, 3)])
def test_absurd_counts(tmp_path, n_kv, n_tensors):
    expect_error(write(tmp_path, build(*good_parts(), n_kv=n_kv, n_tensors=n_tensors)), "truncated|needs")


# --- metadata -----------------------------------------------------------------------------------------------------


def test_huge_string_length(tmp_path):
    bad = struct.pack("<Q", 2**62) + b"abc"
    kvs = [kv("general.architecture", 8, bad)]
    expect_error(write(tmp_path, build(kvs, [])), "general.architecture")


def test_huge_key_length(tmp_path):
    blob = build([struct.pack("<Q", 2**62) + b"k"], [])
    expect_error(write(tmp_path, blob), "metadata key #0")


@pytest.mark.parametrize("etype,count", [(4, 2**60), (8, 2**61), (9, 2**59), (12, 2**62), (0, 2**64 - 1)])
def test_huge_array_counts(tmp_path, etype, count):
    expect_error(write(tmp_path, build([kv_arr("tokenizer.ggml.tokens", etype, count, b"\0" * 16)], [])),
                 "tokenizer.ggml.tokens")


def test_string_array_element_past_end(tmp_path):
    body = s("ok") + struct.pack("<Q", 2**40) + b"xx"
    expect_error(write(tmp_path, build([kv_arr("tokenizer.ggml.tokens", 8, 2, body)], [])),
                 r"tokenizer.ggml.tokens.*\[1\]")


@pytest.mark.parametrize("vtype", [13, 99, 2**31])
def test_unknown_value_type(tmp_path, vtype):
    expect_error(write(tmp_path, build([kv("x.y", vtype, b"\0" * 8)], [])), f"unknown value type {vtype}")


def test_unknown_array_element_type(tmp_path):
    expect_error(write(tmp_path, build([kv_arr("x.y", 42, 1, b"\0" * 8)], [])), "unknown array element type 42")


def test_duplicate_key(tmp_path):
    kvs = [kv_u32("llama.block_count", 1), kv_u32("llama.block_count", 2)]
    expect_error(write(tmp_path, build(kvs, [])), "duplicate metadata key 'llama.block_count'")


def test_invalid_utf8_key(tmp_path):
    raw_key = struct.pack("<Q", 4) + b"b\xff\xfex" + struct.pack("<I", 4) + b"\0" * 4
    expect_error(write(tmp_path, build([raw_key], [])), "metadata key #0 is not valid UTF-8")


@pytest.mark.parametrize("align", [0, 3, 48, 2**31])
def test_bad_alignment(tmp_path, align):
    kvs = [kv_u32("general.alignment", align)]
    expect_error(write(tmp_path, build(kvs, [])), "general.alignment must be a power of two")


def test_custom_alignment_is_used(tmp_path):
    kvs = [kv_u32("general.alignment", 64)]
    data = np.arange(4, dtype=np.float32).tobytes()
    with GGUFFile(write(tmp_path, build(kvs, [ti("t", (4,), 0, 0)], data, align=64))) as gf:
        assert gf.alignment == 64 and gf.tensors["t"].offset % 64 == 0
        np.testing.assert_array_equal(gf.raw("t").view(np.float32), np.arange(4))


# --- tensor table -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case,tis,match", [
    ("type", [ti("t", (8,), 99, 0)], "unknown ggml tensor type 99"),
    ("removed type", [ti("t", (32,), 4, 0)], "unknown ggml tensor type 4|tensor 't'"),
    ("no dims", [ti("t", (), 0, 0)], "0 dims"),
    ("five dims", [ti("t", (1, 1, 1, 1, 1), 0, 0)], "5 dims"),
    ("zero dim", [ti("t", (8, 0), 0, 0)], "invalid shape"),
    ("overflowing dims", [ti("t", (2**32, 2**32, 2**20), 0, 0)], "invalid shape"),
    ("block remainder", [ti("t", (33,), 8, 0)], "row length 33 is not a multiple of the 32-element block"),
    ("unaligned", [ti("t", (8,), 0, 4)], "offset 4 is not aligned"),
    ("past end", [ti("t", (8,), 0, 2**40)], "truncated file: tensor 't'"),
    ("larger than file", [ti("t", (2**40,), 0, 0)], "truncated file: tensor 't'"),
    ("overlap", [ti("a", (16,), 0, 0), ti("b", (8,), 0, 32)], "overlaps"),
    ("duplicate", [ti("a", (8,), 0, 0), ti("a", (8,), 0, 32)], "duplicate tensor name 'a'"),
    ("huge name", [struct.pack("<Q", 2**62)], "tensor name #0"),
])
def test_bad_tensor_info(tmp_path, case, tis, match):
    data = np.zeros(64, np.float32).tobytes()
    expect_error(write(tmp_path, build([kv_str("general.architecture", "llama")], tis, data)), match)


def test_tensor_order_in_file_is_kept(tmp_path):
    # offsets out of order are legal as long as tensors do not overlap
    data = np.arange(16, dtype=np.float32).tobytes()
    tis = [ti("second", (8,), 0, 32), ti("first", (8,), 0, 0)]
    with GGUFFile(write(tmp_path, build([], tis, data))) as gf:
        assert list(gf.tensors) == ["second", "first"]
        np.testing.assert_array_equal(gf.raw("first").view(np.float32), np.arange(8))


# --- truncation and fuzzing ---------------------------------------------------------------------------------------


def test_truncated_everywhere(tmp_path):
    blob = build(*good_parts())
    header_end = blob.index(b"q.weight") + len("q.weight") + 4 + 8 + 4 + 8
    cuts = sorted(set(range(0, header_end + 1)) | set(range(header_end, len(blob), 7)))
    p = tmp_path / "cut.gguf"
    for cut in cuts:
        if cut == len(blob):
            continue
        p.write_bytes(blob[:cut])
        with pytest.raises(GGUFError) as e:
            GGUFFile(p)
        assert "cut.gguf" in str(e.value)
        assert any(w in str(e.value) for w in ("truncated", "too small", "not a GGUF")), (cut, str(e.value))


GOOD_BLOB = build(*good_parts())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, len(GOOD_BLOB) - 1), st.integers(1, 255)), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, len(GOOD_BLOB))))
def test_fuzz_byte_flips(tmp_path, flips, cut):
    blob = bytearray(GOOD_BLOB)
    for pos, x in flips:
        blob[pos] ^= x
    if cut is not None:
        blob = blob[:cut]
    p = tmp_path / "fuzz.gguf"
    p.write_bytes(bytes(blob))
    try:
        with GGUFFile(p) as gf:
            for name in gf.tensors:  # whatever opened must be consistent and readable
                info = gf.tensors[name]
                assert gf.raw(name).nbytes == info.nbytes
                assert info.offset + info.nbytes <= len(blob)
    except GGUFError:
        pass


# --- the real model -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_pair():
    path = resolve_model("default")
    t0 = time.perf_counter()
    gf = GGUFFile(path)
    open_s = time.perf_counter() - t0
    yield gf, GGUFReader(path), open_s
    gf.close()


def _reader_value(field):
    vt = field.types[0]
    if vt == GGUFValueType.ARRAY:
        if field.types[1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
        return np.concatenate([field.parts[i] for i in field.data]) if field.data else np.array([])
    part = field.parts[field.data[0]]
    if vt == GGUFValueType.STRING:
        return bytes(part).decode()
    return part[0].item() if vt != GGUFValueType.BOOL else bool(part[0])


def test_real_gemma3_matches_gguf_reader(real_pair):
    gf, reader, open_s = real_pair
    assert open_s < 5.0  # the issue asks for < 2 s on an idle machine; CI shares its 2 cores
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}  # reader's header pseudo-keys
    assert list(gf.metadata) == list(fields)
    for key, field in fields.items():
        ours, theirs = gf.metadata[key], _reader_value(field)
        if isinstance(ours, np.ndarray):
            assert ours.dtype == theirs.dtype, key
            np.testing.assert_array_equal(ours, theirs, err_msg=key)
        elif isinstance(ours, float):
            assert ours == pytest.approx(theirs, rel=1e-7), key
        else:
            assert ours == theirs, key
    assert list(gf.tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        info = gf.tensors[t.name]
        assert info.ggml_type == int(t.tensor_type), t.name
        assert info.shape == tuple(int(d) for d in t.shape), t.name
        assert info.offset == t.data_offset and info.nbytes == t.n_bytes, t.name
    emb = gf.tensors["token_embd.weight"]
    assert emb.ggml_type == QT.Q8_0 and torch_shape(emb) == (262144, 640)
    np.testing.assert_array_equal(gf.raw("blk.0.attn_norm.weight"), reader.get_tensor(
        [t.name for t in reader.tensors].index("blk.0.attn_norm.weight")).data.view(np.uint8))


def test_deeply_nested_arrays(tmp_path):
    # each level costs 12 bytes, so a small file can nest thousands deep: that must be a GGUFError, not RecursionError
    depth = 5000
    body = struct.pack("<IQ", 9, 1) * (depth - 1) + struct.pack("<IQ", 4, 0)
    expect_error(write(tmp_path, build([kv("x.nested", 9, body)], [])), "x.nested")


@pytest.mark.parametrize("payload", [kv_str("general.alignment", "abc"),
                                     kv_arr("general.alignment", 4, 2, struct.pack("<II", 32, 32)),
                                     kv("general.alignment", 6, struct.pack("<f", 32.5))],
                         ids=["string", "array", "float"])
def test_alignment_of_wrong_type(tmp_path, payload):
    expect_error(write(tmp_path, build([payload], [])), "general.alignment")


def test_ggml_type_table_is_ggmls():
    """Our size table (kept so the engine need not import gguf-py) says what gguf-py's does, for every type."""
    from gguf.constants import GGML_QUANT_SIZES

    from bolt_ros.engine.gguf.types import GGML_TYPES, type_name

    assert {t: (QT(t).name, *GGML_QUANT_SIZES[QT(t)]) for t in GGML_TYPES} == GGML_TYPES
    assert set(GGML_TYPES) == {int(t) for t in GGML_QUANT_SIZES}
    assert type_name(12) == "Q4_K" and type_name(4) == "ggml type 4"
