"""The GGUF conversion cache (`cipr.runtime.embedded.gguf_hf_dir`): written once, reused, never half-written.

The conversion itself is stubbed (the real one reads the embedded model: `tests/test_train_model.py`,
integration tier, checks its tensors against the GGUF's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cipr.runtime import embedded


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "pkg" / "model.Q4.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def test_written_once_then_reused(gguf, tmp_path, monkeypatch):
    calls = []

    def write(out, folder, name):
        calls.append((folder, name))
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(embedded, "_write_hf_folder", write)
    first = embedded.gguf_hf_dir(gguf.parent, gguf.name, tmp_path / "cache")
    again = embedded.gguf_hf_dir(gguf.parent, gguf.name, tmp_path / "cache")
    assert first == again and calls == [(gguf.parent, gguf.name)]
    assert (first / "config.json").is_file() and (first / embedded.HF_DIR_MARKER).is_file()
    assert first.name.startswith("model.Q4-64-") and first.name.endswith(f"-v{embedded.LAYOUT}")
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temporary folder left


def test_a_failed_conversion_leaves_nothing_that_looks_finished(gguf, tmp_path, monkeypatch):
    def broken(out, folder, name):
        (out / "config.json").write_text("{}")
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(embedded, "_write_hf_folder", broken)
    with pytest.raises(RuntimeError, match="killed mid-write"):
        embedded.gguf_hf_dir(gguf.parent, gguf.name, tmp_path / "cache")
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


def test_a_concurrent_writer_that_finished_first_is_used(gguf, tmp_path, monkeypatch):
    cache = tmp_path / "cache"

    def write(out, folder, name):  # another process completes the same folder while this one writes
        other = out.parent / out.name.split(".tmp-")[0].lstrip(".")
        other.mkdir()
        (other / "config.json").write_text('{"writer": "other"}')
        (other / embedded.HF_DIR_MARKER).write_text("{}")
        (out / "config.json").write_text('{"writer": "this"}')

    monkeypatch.setattr(embedded, "_write_hf_folder", write)
    target = embedded.gguf_hf_dir(gguf.parent, gguf.name, cache)
    assert (target / "config.json").read_text() == '{"writer": "other"}'
    assert [p.name for p in target.parent.iterdir()] == [target.name]


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(embedded.EmbeddedModelMissing, match="missing.gguf"):
        embedded.gguf_hf_dir(tmp_path, "missing.gguf", tmp_path / "cache")


def test_vllm_refuses_a_policy_folder_it_cannot_load(tmp_path):
    """A policy's folder without config.json (a GGUF one) stops before TRL builds a vLLM engine; a converted
    one passes."""
    from types import SimpleNamespace

    from cipr.core.config import ConfigError
    from cipr.train.rollout import check_vllm_loadable

    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match="no config.json"):
        check_vllm_loadable(SimpleNamespace(name_or_path=str(tmp_path)))
    (tmp_path / "config.json").write_text("{}")
    check_vllm_loadable(SimpleNamespace(name_or_path=str(tmp_path)))
    check_vllm_loadable(SimpleNamespace(name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct"))  # a hub id
