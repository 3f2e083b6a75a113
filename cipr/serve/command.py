"""The served model's options and backend: `ServeCommand` (what `cipr-serve key=value ...` reads) and
`build_backend`.

Used by `cipr-serve` (`cipr.cli.serve`) and by `cipr-tau2`, which serves the agent the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from cipr.core.errors import ConfigError
from cipr.serve.limits import ServeLimits
from cipr.serve.service import ServeConfig

API_KEY_ENV = "CIPR_SERVE_API_KEY"


@dataclass(frozen=True)
class ServeCommand(ServeLimits, ServeConfig):
    """The command's options: how requests are served (`ServeConfig`), within which limits
    (`ServeLimits`), where, with which key, and by which model.

    - `guard_budget`: the new tokens of each guard model call.
    - `audit`: the guard's audit log file (JSON lines).
    """

    names: Literal["original", "canonical"] = "canonical"
    guard: Literal["off", "none", "naive_retry", "tool_list", "repair"] = "off"
    backend: str = "embedded"  # embedded | a model folder | an OpenAI-compatible http(s):// URL
    host: str = "127.0.0.1"  # 0.0.0.0 serves other machines too (then a key is required)
    api_key: str | None = None  # clients must send 'Authorization: Bearer KEY' (or set CIPR_SERVE_API_KEY)
    port: int = 8000  # 0: a free port, written to port_file
    port_file: str | None = None  # write the port here once the server listens
    model_name: str | None = None  # the served model's name (null: the folder's, or the URL's first model)
    call_format: str = "hermes"  # how the in-process model (or tokenizer=) writes tool calls
    max_new_tokens: int = 512  # per reply of the in-process model
    batch_size: int = 8  # the in-process model decodes up to this many waiting requests together
    device: str = "cpu"  # the in-process model's device (cpu, cuda, auto)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # the in-process model's weights
    threads: int | None = None  # torch CPU threads (null: torch's default)
    api_key_env: str = "OPENAI_API_KEY"  # the variable holding the key of a URL backend
    timeout_s: float = 600.0  # read timeout of a URL backend: the longest one whole reply may take
    connect_timeout_s: float = 5.0  # a URL backend must accept the connection within this
    tokenizer: str | None = None  # with a URL: render prompts with this tokenizer and parse the calls here

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check()
        if self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size}: must be at least 1")

    def limits(self) -> ServeLimits:
        """The `ServeLimits` part of the options."""
        return ServeLimits(**{f.name: getattr(self, f.name) for f in fields(ServeLimits)})

    def key(self) -> str | None:
        """The key clients must send: `api_key`, else $CIPR_SERVE_API_KEY, else none."""
        return self.api_key or os.environ.get(API_KEY_ENV) or None


def build_backend(cmd: ServeCommand) -> Any:
    """The chat backend `cmd.backend` names (nothing is fetched from a hub)."""
    from cipr.runtime.model import load_inference_model, prepare_inference_tokenizer
    from cipr.serve.backends import HFChatBackend, OpenAIChatBackend

    if cmd.backend.startswith(("http://", "https://")) and cmd.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = prepare_inference_tokenizer(AutoTokenizer.from_pretrained(cmd.tokenizer))
        return HFChatBackend(None, tokenizer, call_format=cmd.call_format, model_name=cmd.model_name,
                             max_new_tokens=cmd.max_new_tokens, completions_url=cmd.backend)
    if cmd.backend.startswith(("http://", "https://")):
        return OpenAIChatBackend(cmd.backend, model_name=cmd.model_name, api_key_env=cmd.api_key_env,
                                 timeout_s=cmd.timeout_s, connect_timeout_s=cmd.connect_timeout_s,
                                 max_connections=max(cmd.max_in_flight, 1))
    path = Path(cmd.backend).expanduser()
    if cmd.backend != "embedded" and not path.is_dir():
        raise ConfigError(f"backend={cmd.backend!r}: expected embedded, an http(s):// URL or a model folder")
    model, tokenizer = load_inference_model(cmd.backend if cmd.backend == "embedded" else str(path),
                                            device=cmd.device, dtype=cmd.dtype, threads=cmd.threads)
    name = cmd.model_name or path.name
    return HFChatBackend(model, tokenizer, call_format=cmd.call_format, model_name=name,
                         max_new_tokens=cmd.max_new_tokens, batch_size=cmd.batch_size)
