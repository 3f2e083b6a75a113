"""The one reader of text inputs (`cipr.core.io`): strict UTF-8, and one DataError naming the file and
the byte offset, or the line and column, for bytes that are not UTF-8 or text that is not JSON."""

from __future__ import annotations

import json

import pytest

from cipr.core.errors import DataError
from cipr.core.io import (
    complete_lines,
    decode_text,
    iter_jsonl,
    parse_json,
    read_json,
    read_json_list,
    read_jsonl,
    read_text,
)


def test_text_is_strict_utf8_and_a_bad_byte_is_named_by_its_offset(tmp_path):
    good = tmp_path / "good.txt"
    good.write_bytes("héllo\n".encode())
    assert read_text(good) == "héllo\n"
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"abc\n\xc3(rest")  # a two-byte sequence broken at byte 4
    with pytest.raises(DataError) as e:
        read_text(bad)
    assert e.value.file == str(bad)
    assert str(e.value) == \
        f"file {str(bad)!r}: not a UTF-8 text file (invalid continuation byte at byte offset 4)"
    assert isinstance(e.value.__cause__, UnicodeDecodeError)


@pytest.mark.parametrize("data, offset", [
    (b"\xff\xfe[\x00]\x00", 0),  # UTF-16 with its byte-order mark
    (b'{"a": "caf\xe9"}', 10),  # Latin-1
    (b'{"a": 1}\n{"b": "\xe2\x82"}', 16),  # a three-byte character cut short
])
def test_every_json_reader_refuses_non_utf8_with_the_offset(tmp_path, data, offset):
    path = tmp_path / "x.json"
    path.write_bytes(data)
    for read in (read_json, read_jsonl, lambda p: read_json_list(p, "test file")):
        with pytest.raises(DataError, match=rf"not a UTF-8 text file \(.* at byte offset {offset}\)") as e:
            read(path)
        assert e.value.file == str(path)


def test_a_utf8_byte_order_mark_is_not_taken_for_json(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf[1]")
    with pytest.raises(DataError, match="not valid JSON .*BOM.*: line 1 column 1"):
        read_json(path)


def test_bad_json_names_the_line_and_column(tmp_path):
    path = tmp_path / "doc.json"
    path.write_text('{\n  "a": 1,\n  "b": [1, 2,, 3]\n}\n')
    with pytest.raises(DataError) as e:
        read_json(path)
    assert e.value.file == str(path)
    assert str(e.value) == f"file {str(path)!r}: not valid JSON (Expecting value: line 3 column 14)"
    assert isinstance(e.value.__cause__, json.JSONDecodeError)


def test_bad_json_lines_name_the_line_of_the_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3\n{"a": 4}\n')
    with pytest.raises(DataError, match=r"not valid JSON \(Expecting ',' delimiter: line 4 column 8\)"):
        read_jsonl(path)
    text = path.read_text()
    rows = iter_jsonl(text, path)
    assert [next(rows), next(rows)] == [(1, {"a": 1}), (3, {"a": 2})]  # blank lines skipped, numbers kept
    with pytest.raises(DataError, match=": line 4 column 8"):
        next(rows)
    with pytest.raises(DataError, match="Unterminated string starting at: line 7 column 2"):
        parse_json('{"', path, line=7)  # a row that starts on line 7 of its file


def test_a_raw_line_separator_inside_a_string_does_not_split_a_row(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"a": "x\u2028y"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert read_jsonl(path) == [{"a": "x\u2028y"}]


def test_too_deep_json_is_a_data_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataError, match="nests too deeply"):
        read_json(path)


def test_torn_last_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": \xe2\x82')  # killed inside a line (and a character)
    with pytest.raises(DataError, match="unexpected end of data at byte offset 24"):
        read_jsonl(path)
    assert read_jsonl(path, torn="skip") == [{"a": 1}, {"a": 2}]
    assert path.read_bytes().endswith(b"\xe2\x82")  # skip reads only
    assert read_jsonl(path, torn="cut") == [{"a": 1}, {"a": 2}]
    assert path.read_bytes() == b'{"a": 1}\n{"a": 2}\n'
    assert read_jsonl(tmp_path / "none.jsonl", torn="skip") == [] == \
        read_jsonl(tmp_path / "none.jsonl", torn="cut")
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "none.jsonl")
    assert complete_lines(tmp_path / "none.jsonl", cut=True) == b""


def test_a_bad_line_before_the_last_is_never_taken_for_a_torn_one(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": \n{"a": 3}\n{"a"')
    for torn in ("error", "skip", "cut"):
        with pytest.raises(DataError, match=": line 2 column 7"):
            read_jsonl(path, torn=torn)


def test_read_json_list(tmp_path):
    from cipr.core.errors import MissingInputError

    with pytest.raises(MissingInputError, match="test file not found"):
        read_json_list(tmp_path / "none.json", "test file")
    path = tmp_path / "obj.json"
    path.write_text('{"a": 1}')
    with pytest.raises(DataError, match="expected a JSON list of rows"):
        read_json_list(path, "test file", "a JSON list of rows")
    path.write_text("[1, 2]")
    assert read_json_list(path, "test file") == [1, 2]


def test_decode_text_names_the_given_file():
    with pytest.raises(DataError, match=r"file 'some/where.jsonl': .*at byte offset 1\)"):
        decode_text(b"a\x80", "some/where.jsonl")
