"""`cipr-serve key=value ...`: the adapter (and optionally the guard) as an OpenAI-compatible endpoint.

Examples. One CPU (the embedded SmolLM2-135M in this process; clients use http://127.0.0.1:8000/v1):
    cipr-serve backend=embedded names=canonical port=8000 threads=1
In front of any OpenAI-compatible server (e.g. vLLM, CPU build or GPU), with the guard and its audit log:
    python -m vllm.entrypoints.openai.api_server --model exports/q3b_cipr --port 8001 &
    cipr-serve backend=http://127.0.0.1:8001/v1 names=canonical guard=repair audit=runs/audit.jsonl port=8000
The server then parses tool calls itself (vLLM: `--enable-auto-tool-choice --tool-call-parser NAME`). For a
checkpoint no server parser reads (the embedded SmolLM2 exported), add `tokenizer=DIR`: cipr-serve renders the
prompt with `call_format` and the tokenizer's chat template, calls the server's text-completions endpoint and
parses the calls itself (`cipr.runtime.backends.CompletionsBackend`):
    cipr-serve backend=http://127.0.0.1:8001/v1 tokenizer=exports/smollm2 names=canonical port=8000
One GPU: the same two lines (vLLM on the GPU), or `backend=exports/q3b_cipr device=cuda` (HF in process).
Several GPUs: one vLLM server with `--tensor-parallel-size N` behind one cipr-serve.
Slurm: run both lines inside one job step (`srun --gres=gpu:1 bash -c '... & cipr-serve ...'`). Clients on
    other nodes need host=0.0.0.0, a key and the node's name in their URL; without a key cipr-serve
    refuses to listen beyond loopback:
    CIPR_SERVE_API_KEY=$(openssl rand -hex 16) cipr-serve host=0.0.0.0 ...   # clients send Bearer <key>

Both arms of a comparison from one server: `/original/v1` forwards names unchanged, `/canonical/v1`
canonicalizes; `/v1` uses `names=`. `stream: true` is served as events after the whole turn. `GET /health`
answers without a key. Limits, queue and timeouts: docs/serve_and_tau2.md. Stop with SIGINT or SIGTERM.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cipr.cli.common import run_command
from cipr.serve.command import ServeCommand, build_backend


def serve(cmd: ServeCommand) -> int:
    """Serve until SIGINT or SIGTERM."""
    from cipr.serve import ChatService, start, stop
    from cipr.serve.http import check_bind
    from cipr.serve.protocol import redact

    key = cmd.key()
    check_bind(cmd.host, key)  # before loading a model
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one access line a request is ours
    server, thread = start(ChatService(build_backend(cmd), cmd), cmd.host, cmd.port, limits=cmd.limits(),
                           api_key=key)
    if cmd.port_file:
        Path(cmd.port_file).write_text(f"{server.server_address[1]}\n")
    print(f"cipr-serve: {server.url}/v1 (names={cmd.names}), {server.url}/original/v1, "
          f"{server.url}/canonical/v1; backend={redact(cmd.backend)}, guard={cmd.guard}, "
          f"key={'required' if key else 'none (loopback only)'}, queue={cmd.max_in_flight}+{cmd.max_waiting}",
          flush=True)
    done = {"stop": False}

    def _stop(signum: int, frame: Any) -> None:
        done["stop"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not done["stop"] and thread.is_alive():
        thread.join(0.5)
    stop(server, thread)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`cipr-serve` entry point."""
    return run_command("cipr-serve", __doc__, {"": (ServeCommand, serve)}, argv)


if __name__ == "__main__":
    sys.exit(main())
