"""Where model weights come from, with no network access unless the user asks for it.

A model option (`cipr-eval model=`, `model.name_or_path=`, an adapter's base) names one of:
- an existing folder: loaded from there;
- a path that does not exist (it starts with `/`, `.` or `~`, has more than one `/`, or its first
  component is an existing folder, like `runs/no_such_model`): a ConfigError naming it, at once;
- a hub id (`org/name`): loaded from the local Hugging Face cache only. Downloading is allowed only
  when the user sets `HF_HUB_OFFLINE=0` explicitly (`downloads_allowed`); every command otherwise
  runs with `HF_HUB_OFFLINE=1` (`stay_offline`), so no library contacts the hub behind its back.
An `http(s)://` model (an OpenAI-compatible endpoint) is a URL the user named, and is not resolved here.
"""

from __future__ import annotations

import os
from pathlib import Path

from cipr.core.errors import ConfigError

OPT_IN = "HF_HUB_OFFLINE=0"


def downloads_allowed() -> bool:
    """Whether the user explicitly allowed hub downloads (`HF_HUB_OFFLINE=0` in the environment)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("0", "false", "no", "off")


def stay_offline() -> None:
    """HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1 unless the user chose otherwise; call before HF imports."""
    if not downloads_allowed():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def looks_like_path(name: str) -> bool:
    """Whether `name` can only be a filesystem path, not a hub id (module docstring)."""
    if (name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith("/")
            or os.sep != "/" and os.sep in name):
        return True
    first = name.split("/", 1)[0]
    return "/" in name and Path(first).is_dir()


def in_cache(repo_id: str, revision: str | None = None) -> bool:
    """Whether the local Hugging Face cache holds the model's config.json."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json", revision=revision), str)
    except ValueError:  # not a valid repo id
        return False


def resolve_model(name: str, *, option: str = "model", revision: str | None = None) -> str:
    """The folder or hub id to load `name` from; ConfigError when neither a folder nor usable offline."""
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists():
        raise ConfigError(f"{option}={name!r} is a file: give the folder that holds config.json and the "
                          "weights")
    if looks_like_path(name):
        raise ConfigError(f"{option}={name!r}: no such folder (check the path; give the folder that holds "
                          f"config.json and the weights)")
    if downloads_allowed() or in_cache(name, revision):
        return name
    raise ConfigError(f"{option}={name!r} is neither a local folder nor a model in the local Hugging Face "
                      f"cache; downloads are off: give a folder, download it once (`hf download {name}`), or "
                      f"allow downloads with {OPT_IN}")
