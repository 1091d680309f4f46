"""GGUF interoperability with the reference Python implementation (PyPI `gguf`).

Our writer -> gguf.GGUFReader, and gguf.GGUFWriter -> our reader (through tests/tools/gguf_tool.cpp), comparing every
key, value type, value, tensor name, shape, type and byte.
"""
import json
import math
import subprocess

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
VT = gguf.GGUFValueType
QT = gguf.GGMLQuantizationType


def sample_byte(tensor_index: int, k: int) -> int:
    """Same formula as tests/cpp/gguf_samples.h."""
    return (k * 131 + tensor_index * 29 + 7) & 0xFF


def sample_bytes(tensor_index: int, n: int) -> bytes:
    return bytes(sample_byte(tensor_index, k) for k in range(n))


# What sample_every_value() in tests/cpp/gguf_samples.h writes, restated independently.
SAMPLE_KVS = [
    ("general.architecture", VT.STRING, None, "qwen3moe"),
    ("test.u8", VT.UINT8, None, 200),
    ("test.i8", VT.INT8, None, -100),
    ("test.u16", VT.UINT16, None, 60000),
    ("test.i16", VT.INT16, None, -30000),
    ("test.u32", VT.UINT32, None, 4000000000),
    ("test.i32", VT.INT32, None, -2000000000),
    ("test.u64", VT.UINT64, None, 18000000000000000000),
    ("test.i64", VT.INT64, None, -9000000000000000000),
    ("test.f32", VT.FLOAT32, None, 0.15625),
    ("test.f64", VT.FLOAT64, None, -1.0e300),
    ("test.bool", VT.BOOL, None, True),
    ("test.string", VT.STRING, None, "h\u00e9llo \u20ac \U0001F600"),
    ("test.empty_string", VT.STRING, None, ""),
    ("test.arr_u8", VT.ARRAY, VT.UINT8, [0, 1, 255]),
    ("test.arr_i8", VT.ARRAY, VT.INT8, [-128, 0, 127]),
    ("test.arr_u16", VT.ARRAY, VT.UINT16, [1, 65535]),
    ("test.arr_i16", VT.ARRAY, VT.INT16, [-32768, 32767]),
    ("test.arr_u32", VT.ARRAY, VT.UINT32, [7, 4294967295]),
    ("test.arr_i32", VT.ARRAY, VT.INT32, [11, 11, 10, 0]),
    ("test.arr_u64", VT.ARRAY, VT.UINT64, [1 << 63]),
    ("test.arr_i64", VT.ARRAY, VT.INT64, [-(1 << 62), 5]),
    ("test.arr_f32", VT.ARRAY, VT.FLOAT32, [1.5, -2.25, float(np.float32(1e-30))]),
    ("test.arr_f64", VT.ARRAY, VT.FLOAT64, [3.141592653589793, -0.0]),
    ("test.arr_bool", VT.ARRAY, VT.BOOL, [True, False, True]),
    ("test.arr_empty", VT.ARRAY, VT.FLOAT32, []),
    ("test.arr_str", VT.ARRAY, VT.STRING, ["a", "", "\u0120the", "<|im_end|>"]),
]

SAMPLE_TENSORS = [
    ("token_embd.weight", QT.F32, [8, 3], 96),
    ("blk.0.attn_q.weight", QT.F16, [16, 2], 64),
    ("blk.0.ffn_gate_exps.weight", QT.Q8_0, [64, 2, 2], 4 * 2 * 34),
    ("blk.0.ffn_down_exps.weight", QT.Q4_K, [256, 1, 2], 2 * 144),
    ("blk.0.ffn_up_exps.weight", QT.MXFP4, [32, 2, 2, 1], 4 * 17),
    ("output.weight", QT.BF16, [5], 10),
    ("blk.0.attn_sinks", QT.I32, [3], 12),
]


def same_value(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b and type(a) is type(b)


def reader_value(field):
    """(type, element type, value) of a GGUFReader field, with Python values."""
    main = VT(field.types[0])
    if main != VT.ARRAY:
        v = field.contents()
        if main == VT.BOOL:
            v = bool(v)
        return main, None, v
    # An empty array carries no element types in field.types; its element type is the first part after the key.
    sub = VT(field.types[-1]) if len(field.types) > 1 else VT(int(field.parts[3][0]))
    v = field.contents()
    if sub == VT.BOOL:
        v = [bool(x) for x in v]
    return main, sub, v


@pytest.mark.parametrize("alignment", [32, 64, 1024])
def test_our_writer_reads_back_in_gguf_py(tool, tmp_path, alignment):
    path = tmp_path / "ours.gguf"
    subprocess.run([tool("gguf_tool"), "write-sample", path, str(alignment)], check=True)
    r = gguf.GGUFReader(path)

    fields = [(k, f) for k, f in r.fields.items() if not k.startswith("GGUF.")]
    want = list(SAMPLE_KVS)
    if alignment != 32:
        want.insert(1, ("general.alignment", VT.UINT32, None, alignment))
    assert [k for k, _ in fields] == [k for k, *_ in want]
    for (key, field), (_, wtype, wsub, wval) in zip(fields, want):
        typ, sub, val = reader_value(field)
        assert (typ, sub) == (wtype, wsub), key
        if isinstance(wval, list):
            assert len(val) == len(wval), key
            assert all(same_value(a, b) for a, b in zip(val, wval)), (key, val, wval)
        else:
            assert same_value(val, wval), (key, val, wval)

    assert r.alignment == alignment
    assert r.data_offset % alignment == 0
    assert len(r.tensors) == len(SAMPLE_TENSORS)
    for i, (t, (name, qtype, shape, n_bytes)) in enumerate(zip(r.tensors, SAMPLE_TENSORS)):
        assert t.name == name
        assert t.tensor_type == qtype
        assert [int(d) for d in t.shape] == shape, name
        assert t.n_bytes == n_bytes, name
        assert (t.data_offset - r.data_offset) % alignment == 0
        assert bytes(r.data[t.data_offset:t.data_offset + t.n_bytes]) == sample_bytes(i, n_bytes), name


def _write_with_gguf_py(path, alignment):
    w = gguf.GGUFWriter(path, arch="pytest")
    if alignment != 32:
        w.add_custom_alignment(alignment)
    scalars = [
        ("p.u8", VT.UINT8, 255), ("p.i8", VT.INT8, -1), ("p.u16", VT.UINT16, 513), ("p.i16", VT.INT16, -513),
        ("p.u32", VT.UINT32, 3000000000), ("p.i32", VT.INT32, -7), ("p.u64", VT.UINT64, (1 << 64) - 1),
        ("p.i64", VT.INT64, -(1 << 63)), ("p.f32", VT.FLOAT32, -0.5), ("p.f64", VT.FLOAT64, 1e-310),
        ("p.bool", VT.BOOL, False), ("p.str", VT.STRING, "\u4f60\u597d, world"),
    ]
    for key, vt, v in scalars:
        w.add_key_value(key, v, vt)
    arrays = [
        ("p.a_u8", VT.UINT8, [9, 8]), ("p.a_i8", VT.INT8, [-9]), ("p.a_u16", VT.UINT16, [0, 65535]),
        ("p.a_i16", VT.INT16, [-1, 1]), ("p.a_u32", VT.UINT32, [1, 2, 3]), ("p.a_i32", VT.INT32, [-5, 5]),
        ("p.a_u64", VT.UINT64, [(1 << 64) - 1, 0]), ("p.a_i64", VT.INT64, [-(1 << 63)]),
        ("p.a_f32", VT.FLOAT32, [0.25, 1e38]), ("p.a_f64", VT.FLOAT64, [2.5, -1e-300]),
        ("p.a_bool", VT.BOOL, [False, True]), ("p.a_str", VT.STRING, ["\u00fc", "two words", ""]),
    ]
    for key, sub, v in arrays:
        w.add_key_value(key, v, VT.ARRAY, sub_type=sub)

    rng = np.random.default_rng(1234)
    tensors = []  # (name, qtype, ne, raw bytes)

    def plain(name, arr, qtype):
        w.add_tensor(name, arr)
        tensors.append((name, qtype, list(reversed(arr.shape)), arr.tobytes()))

    plain("p.f32", rng.standard_normal((3, 8)).astype(np.float32), QT.F32)
    plain("p.f16", rng.standard_normal((2, 2, 16)).astype(np.float16), QT.F16)
    plain("p.f64", rng.standard_normal((5,)).astype(np.float64), QT.F64)
    plain("p.i8", rng.integers(-128, 127, (7,), dtype=np.int8), QT.I8)
    plain("p.i16", rng.integers(-1000, 1000, (2, 3), dtype=np.int16), QT.I16)
    plain("p.i32", rng.integers(-1000, 1000, (1, 1, 1, 9), dtype=np.int32), QT.I32)
    plain("p.i64", rng.integers(-1000, 1000, (4,), dtype=np.int64), QT.I64)
    # Quantized tensors go in as bytes (last dimension in bytes); gguf-py converts the shape to elements.
    for name, qtype, ne in [("p.q4_k", QT.Q4_K, [512, 2]), ("p.q8_0", QT.Q8_0, [64, 3, 2]),
                            ("p.mxfp4", QT.MXFP4, [32, 4]), ("p.bf16", QT.BF16, [6, 2]),
                            ("p.iq2_xxs", QT.IQ2_XXS, [256, 1]), ("p.q6_k", QT.Q6_K, [256, 2, 1, 2])]:
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        row_bytes = ne[0] // block * type_size
        byte_shape = tuple(reversed(ne[1:])) + (row_bytes,)
        raw = rng.integers(0, 256, byte_shape, dtype=np.uint8)
        w.add_tensor(name, raw, raw_dtype=qtype)
        tensors.append((name, qtype, ne, raw.tobytes()))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return scalars, arrays, tensors


TYPE_NAMES = {VT.UINT8: "u8", VT.INT8: "i8", VT.UINT16: "u16", VT.INT16: "i16", VT.UINT32: "u32",
              VT.INT32: "i32", VT.FLOAT32: "f32", VT.BOOL: "bool", VT.STRING: "string", VT.ARRAY: "array",
              VT.UINT64: "u64", VT.INT64: "i64", VT.FLOAT64: "f64"}


def _expected_json_value(vt, v):
    if vt == VT.FLOAT32:
        return float(np.float32(v))
    return v


@pytest.mark.parametrize("alignment", [32, 128])
def test_gguf_py_writer_reads_back_in_ours(tool, tmp_path, alignment):
    path = tmp_path / "theirs.gguf"
    scalars, arrays, tensors = _write_with_gguf_py(path, alignment)
    out = subprocess.run([tool("gguf_tool"), "dump", path], check=True, capture_output=True, text=True).stdout
    d = json.loads(out)
    ref = gguf.GGUFReader(path)

    assert d["version"] == 3
    assert d["alignment"] == alignment
    assert d["data_offset"] == ref.data_offset

    want = [("general.architecture", "string", None, "pytest")]
    if alignment != 32:
        want.append(("general.alignment", "u32", None, alignment))
    want += [(k, TYPE_NAMES[vt], None, _expected_json_value(vt, v)) for k, vt, v in scalars]
    want += [(k, "array", TYPE_NAMES[sub], [_expected_json_value(sub, x) for x in v]) for k, sub, v in arrays]
    got = [(kv["key"], kv["type"], kv.get("elem_type"), kv["value"]) for kv in d["kvs"]]
    assert [g[:3] for g in got] == [w_[:3] for w_ in want]
    for g, w_ in zip(got, want):
        if isinstance(w_[3], list):
            assert len(g[3]) == len(w_[3]) and all(same_value(a, b) for a, b in zip(g[3], w_[3])), (g, w_)
        else:
            assert same_value(g[3], w_[3]), (g, w_)

    assert len(d["tensors"]) == len(tensors)
    for t, ref_t, (name, qtype, ne, raw) in zip(d["tensors"], ref.tensors, tensors):
        assert t["name"] == name
        assert t["type_id"] == int(qtype) and t["type"] == qtype.name
        assert t["shape"] == ne
        assert t["n_bytes"] == len(raw)
        assert bytes.fromhex(t["data"]) == raw, name
        assert d["data_offset"] + t["offset"] == ref_t.data_offset


def test_real_vocabulary_file_matches_gguf_py(tool, shared_dir):
    path = shared_dir / "testdata" / "vocab" / "ggml-vocab-qwen2.gguf"
    out = subprocess.run([tool("gguf_tool"), "dump", path], check=True, capture_output=True, text=True).stdout
    d = json.loads(out)
    ref = gguf.GGUFReader(path)
    fields = [(k, f) for k, f in ref.fields.items() if not k.startswith("GGUF.")]
    assert [kv["key"] for kv in d["kvs"]] == [k for k, _ in fields]
    for kv, (key, field) in zip(d["kvs"], fields):
        typ, sub, val = reader_value(field)
        assert kv["type"] == TYPE_NAMES[typ], key
        assert kv.get("elem_type") == (TYPE_NAMES[sub] if sub is not None else None), key
        if isinstance(val, list):
            assert kv["value"] == val, key
        else:
            assert same_value(kv["value"], val), key
    assert d["tensors"] == []
