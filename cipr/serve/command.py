"""The served model's options and backend: `ServeCommand`, its `key=value` parser, and `build_backend`.

Used by `cipr-serve` (`cipr.cli.serve`) and by `cipr-tau2`, which serves the agent the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cipr.core.config import from_overrides
from cipr.core.errors import ConfigError


@dataclass
class ServeCommand:
    """The command's options (see the module docstring)."""

    backend: str = "embedded"
    names: Literal["original", "canonical"] = "canonical"
    guard: Literal["off", "none", "naive_retry", "tool_list", "repair"] = "off"
    guard_budget: int = 512
    audit: str | None = None
    rewrite_text: str = "identifiers"
    host: str = "127.0.0.1"
    port: int = 8000
    port_file: str | None = None
    model_name: str | None = None
    call_format: str = "hermes"
    max_new_tokens: int = 512
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    threads: int | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 600.0
    tokenizer: str | None = None


def parse_args(argv: Sequence[str]) -> ServeCommand:
    """`cipr-serve` arguments (`key=value`, as every cipr command spells them: `cipr.core.config.from_overrides`)."""
    return from_overrides(ServeCommand, [a for a in argv if a != "--debug"])


def load_hf(source: str, device: str, dtype: str) -> tuple[Any, Any, str]:
    """(model, tokenizer, served name) for `embedded` or a local model folder; nothing from a hub."""
    import torch

    from cipr.eval.evaluate import prepare_tokenizer

    torch_dtype = getattr(torch, dtype)
    if source == "embedded":
        from cipr.runtime.embedded import load_embedded

        model, tokenizer = load_embedded(dtype=torch_dtype)
        name = "embedded"
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(source).expanduser()
        if not path.is_dir():
            raise ConfigError(f"backend={source!r}: expected embedded, an http(s):// URL or a model folder")
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        name = path.name
    model.to(device)
    model.eval()
    return model, prepare_tokenizer(tokenizer), name


def build_backend(cmd: ServeCommand) -> Any:
    """The chat backend `cmd.backend` names."""
    from cipr.serve.backends import HFChatBackend, OpenAIChatBackend

    if cmd.backend.startswith(("http://", "https://")) and cmd.tokenizer:
        from transformers import AutoTokenizer

        from cipr.eval.evaluate import prepare_tokenizer

        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(cmd.tokenizer))
        return HFChatBackend(None, tokenizer, call_format=cmd.call_format, model_name=cmd.model_name,
                             max_new_tokens=cmd.max_new_tokens, completions_url=cmd.backend)
    if cmd.backend.startswith(("http://", "https://")):
        return OpenAIChatBackend(cmd.backend, model_name=cmd.model_name, api_key_env=cmd.api_key_env,
                                 timeout_s=cmd.timeout_s)
    if cmd.threads:
        import torch

        torch.set_num_threads(cmd.threads)
    model, tokenizer, name = load_hf(cmd.backend, cmd.device, cmd.dtype)
    return HFChatBackend(model, tokenizer, call_format=cmd.call_format, model_name=cmd.model_name or name,
                         max_new_tokens=cmd.max_new_tokens)
