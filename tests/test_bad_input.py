"""Hostile input to every command: each case runs the command's own entry point and must end with exit
status 2, one line on stderr naming the offending file, option or value, no traceback, and every file
it was given (inputs and earlier outputs) byte-identical afterwards.

Also here: checkpoint integrity on resume (a truncated newest checkpoint falls back to the previous
complete one), and the safe-output helpers of `cipr.core.io`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from cipr.data.bfcl import PARTITIONS
from cipr.data.paths import data_root

ROOT = Path(__file__).resolve().parents[1]
BFCL_SIMPLE = data_root() / "bfcl_v4" / "BFCL_v4_simple_python.json"


def tree_digest(*roots: Path) -> dict[str, str]:
    """Path -> sha256 of every file under (or at) the roots."""
    out = {}
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A workspace: a tiny model folder, an export of it, a finished 3-step SFT run, an evaluation folder."""
    from support.tiny_models import save_tiny

    from cipr.eval.config import EvalConfig
    from cipr.eval.evaluate import evaluate
    from cipr.runtime.export import ExportConfig, export
    from cipr.train.run import config_from_dict, run

    root = tmp_path_factory.mktemp("bad_input")
    plain = save_tiny(root / "plain")
    export(plain, root / "exported", ExportConfig(call_format="hermes", names="original"))
    run(config_from_dict(train_config(root / "run", plain, steps=3)))
    for name in ("a", "b"):
        evaluate(EvalConfig(backend="replay", limit=2, partitions=["simple_python"],
                            perturbations=["original"], out_dir=str(root / "evals" / name), progress=False))
    (root / "notes.txt").write_text("the user's own file\n")
    (root / "user_folder").mkdir()
    (root / "user_folder" / "keep.txt").write_text("not ours\n")
    return root


def train_config(run_dir: Path, model: Path, steps: int = 2, **trainer) -> dict:
    return {
        "model": {"name_or_path": str(model), "gguf_package": None, "gguf_file": None, "short_name": "tiny",
                  "dtype": "float32", "call_format": "hermes", "attn_implementation": "eager"},
        "data": {"source": "synthetic", "n": 8, "seed": 0, "eval_examples": 0},
        "algo": {"name": "sft"},
        "trainer": {"run_dir": str(run_dir), "max_steps": steps, "save_steps": 1, "save_total_limit": None,
                    "per_device_train_batch_size": 2, "learning_rate": 1e-3, "torch_threads": 1, **trainer},
        "logging": {"progress_bar": False},
    }


# ---------------------------------------------------------------- how each command is run in process


def cipr_data(*args: str) -> Callable[[Path], int]:
    from cipr.cli.data import main

    return lambda w: main([a.format(w=w) for a in args])


def cipr_export(*args: str) -> Callable[[Path], int]:
    from cipr.cli.export import main

    return lambda w: main([a.format(w=w) for a in args])


def cipr_compare(*args: str) -> Callable[[Path], int]:
    from cipr.cli.eval import compare_main

    return lambda w: compare_main([a.format(w=w) for a in args])


def cipr_eval(*overrides: str) -> Callable[[Path], int]:
    """The Hydra task function of cipr-eval on the composed overrides."""

    def call(w: Path) -> int:
        from hydra import compose, initialize_config_dir

        from cipr.cli.eval import CONFIG_DIR, run

        given = [o.format(w=w) for o in overrides]
        if not any(o.startswith("out_dir=") for o in given):
            given.append(f"out_dir={w / 'evals' / 'new'}")
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
            cfg = compose(config_name="eval", overrides=["progress=false", "device=cpu", *given])
        run(cfg)
        return 0

    return call


def cipr_eval_main(*args: str) -> Callable[[Path], int]:
    """`cipr-eval`'s console entry point with these arguments (for checks made before Hydra starts)."""

    def call(w: Path) -> int:
        from cipr.cli.eval import main

        old = sys.argv
        sys.argv = ["cipr-eval", *(a.format(w=w) for a in args)]
        try:
            main()
        finally:
            sys.argv = old
        return 0

    return call


def cipr_train(*overrides: str, model: str = "{w}/plain") -> Callable[[Path], int]:
    """cipr-train's entry (`_main`) on the composed overrides, with the tiny model unless overridden."""

    def call(w: Path) -> int:
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        from cipr.cli.train import CONFIG_DIR, _main

        given = [o.format(w=w) for o in overrides]
        base = [f"model.name_or_path={model.format(w=w)}", "model.gguf_package=null", "model.gguf_file=null",
                "model.call_format=hermes", "algo=sft", "trainer.max_steps=1", "trainer.torch_threads=1",
                f"trainer.run_dir={w / 'runs' / 'new'}"]
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("train", overrides=[*base, *given])
        return _main(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)))

    return call


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[Path], int]
    message: str  # must appear in the error line
    watch: tuple[str, ...] = ("{w}",)  # files and folders that must be byte-identical afterwards
    setup: Callable[[Path], None] | None = None


def _truncate_line(w: Path) -> None:
    root = w / "data" / "toolrl"
    root.mkdir(parents=True, exist_ok=True)
    (root / "broken.json").write_text('[{"instruction": "x", "input": "y", "output": "z"}')
    (root / "object.json").write_text('{"instruction": "x"}')


def _utf16_bfcl(w: Path) -> None:
    """A BFCL copy whose first question file starts with the bytes ff fe (a UTF-16 byte-order mark)."""
    name = f"BFCL_v4_{next(iter(PARTITIONS))}.json"
    target = w / "data_utf16" / "bfcl_v4" / name
    if not target.exists():
        target.parent.mkdir(parents=True)
        first = (BFCL_SIMPLE.parent / name).read_bytes().split(b"\n")[0]
        target.write_bytes(b"\xff\xfe" + first + b"\n")


def _bad_manifest(w: Path) -> None:
    target = w / "bad_manifest"
    if not target.exists():
        shutil.copytree(w / "exported", target)
        (target / "cipr_manifest.json").write_text(json.dumps({"version": 99, "call_format": "hermes"}))


def _bad_results(w: Path) -> None:
    for name, first in (("torn_middle", b'{"id": "x", "names"\n'), ("bad_meta", None)):
        target = w / "evals" / name
        if not target.exists():
            shutil.copytree(w / "evals" / "a", target)
            if first is not None:
                data = (target / "results.jsonl").read_bytes()
                (target / "results.jsonl").write_bytes(first + data)
            else:
                (target / "run.json").write_text("{not json")


def _unfinished_run(w: Path) -> None:
    target = w / "unfinished"
    if not target.exists():
        shutil.copytree(w / "run", target)
        (target / "sft" / "stage.json").unlink()
        (target / "sft" / "latest.json").write_text("garbage{")
        shutil.rmtree(target / "sft" / "checkpoint-3")
        (target / "sft" / "checkpoint-2" / "model.safetensors").write_bytes(b"\0" * 16)


def _garbage_tracker(w: Path) -> None:
    target = w / "runs" / "garbage"
    if not target.exists():
        (target / "sft").mkdir(parents=True)
        (target / "sft" / "latest.json").write_text("\x00\x01 not json")


CASES = [
    # cipr-data
    Case("data-out-is-its-input", cipr_data("export", "source=bfcl", "limit=2", f"out={BFCL_SIMPLE}"),
         "this command's input", watch=(str(BFCL_SIMPLE),)),
    Case("data-out-is-a-folder", cipr_data("export", "source=bfcl", "limit=2", "out={w}/user_folder"),
         "is a folder"),
    Case("data-out-exists", cipr_data("export", "source=synthetic", "n=2", "out={w}/notes.txt"),
         "already exists"),
    Case("data-out-under-a-file", cipr_data("export", "source=synthetic", "n=2", "out={w}/notes.txt/x.jsonl"),
         "is a file"),
    Case("data-limit-negative", cipr_data("export", "source=bfcl", "limit=-1", "out={w}/x.jsonl"),
         "limit=-1"),
    Case("data-limit-zero", cipr_data("export", "source=bfcl", "limit=0", "out={w}/x.jsonl"), "limit=0"),
    Case("data-root-missing", cipr_data("export", "source=bfcl", "data_root={w}/nowhere", "out={w}/x.jsonl"),
         "nowhere/bfcl_v4"),
    Case("data-stats-root-missing", cipr_data("stats", "source=rotbench", "data_root={w}/nowhere"),
         "nowhere/rotbench"),
    Case("data-stats-bfcl-not-utf8", cipr_data("stats", "source=bfcl", "data_root={w}/data_utf16"),
         f"_utf16/bfcl_v4/BFCL_v4_{next(iter(PARTITIONS))}.json': not a UTF-8 text file (invalid start byte "
         "at byte offset 0)", setup=_utf16_bfcl),
    Case("data-toolrl-missing-file", cipr_data("export", "source=toolrl", "path={w}/none.parquet",
                                               "out={w}/x.jsonl"), "none.parquet"),
    Case("data-toolrl-malformed-json", cipr_data("export", "source=toolrl", "out={w}/x.jsonl",
                                                 "path={w}/data/toolrl/broken.json"), "broken.json",
         setup=_truncate_line),
    Case("data-toolrl-not-a-list", cipr_data("export", "source=toolrl", "path={w}/data/toolrl/object.json",
                                             "out={w}/x.jsonl"), "expected a JSON list",
         setup=_truncate_line),
    Case("data-unknown-perturbation", cipr_data("export", "source=bfcl", "perturb=nope", "out={w}/x.jsonl"),
         "perturb='nope'"),
    Case("data-order-without-cost-type", cipr_data("export", "source=bfcl", "perturb=typos",
                                                   "order=costly_first", "out={w}/x.jsonl"),
         "order=costly_first"),
    Case("data-unknown-option", cipr_data("export", "source=bfcl", "limt=2", "out={w}/x.jsonl"),
         "Did you mean 'limit'?"),
    Case("data-trajectories-out-exists", cipr_data("trajectories", "n=2", "out={w}/notes.txt"),
         "already exists"),
    Case("data-trajectories-n-zero", cipr_data("trajectories", "n=0", "out={w}/t.json"), "n=0"),
    Case("data-fetch-dest-is-a-file", cipr_data("fetch", "data_root={w}/notes.txt"), "is a file"),
    # cipr-export
    Case("export-into-its-source", cipr_export("run_dir={w}/run", "out_dir={w}/run", "overwrite=true"),
         "is the source"),
    Case("export-into-a-parent-of-its-source",
         cipr_export("run_dir={w}/run", "out_dir={w}", "overwrite=true"), "holds the source"),
    Case("export-checkpoint-into-its-run", cipr_export("run_dir={w}/run/sft/checkpoint-2", "out_dir={w}/run",
                                                       "overwrite=true"), "holds the source"),
    Case("export-overwrite-foreign-folder", cipr_export("run_dir={w}/run", "out_dir={w}/user_folder",
                                                        "overwrite=true"), "holds no cipr_manifest.json"),
    Case("export-into-non-empty-folder", cipr_export("run_dir={w}/run", "out_dir={w}/user_folder"),
         "exists and is not empty"),
    Case("export-out-is-a-file", cipr_export("run_dir={w}/run", "out_dir={w}/notes.txt"), "is a file"),
    Case("export-missing-source", cipr_export("run_dir={w}/nothing", "out_dir={w}/exp"), "not a folder"),
    Case("export-missing-out-dir", cipr_export("run_dir={w}/run"), "'out_dir' is required"),
    Case("export-plain-folder-without-format", cipr_export("run_dir={w}/plain", "out_dir={w}/exp"),
         "give call_format="),
    Case("export-unknown-format", cipr_export("run_dir={w}/plain", "out_dir={w}/exp", "call_format=nope",
                                              "names=original"), "unknown call format"),
    Case("export-eval-folder-without-summary", cipr_export("run_dir={w}/run", "out_dir={w}/exported",
                                                           "eval_dirs=[{w}/user_folder]"), "no summary.json"),
    Case("export-unfinished-run-garbage-tracker", cipr_export("run_dir={w}/unfinished", "out_dir={w}/exp"),
         "has not finished", setup=_unfinished_run),
    # cipr-eval
    Case("eval-missing-relative-model-folder", cipr_eval("model=runs/no_such_model"), "no_such_model"),
    Case("eval-uncached-hub-id", cipr_eval("model=nobody-here/no-model"), "local Hugging Face cache"),
    Case("eval-limit-negative", cipr_eval("limit=-1", "backend=replay"), "limit=-1"),
    Case("eval-limit-not-a-number", cipr_eval("limit=abc", "backend=replay"), "limit"),
    Case("eval-batch-size-zero", cipr_eval("batch_size=0"), "batch_size=0"),
    Case("eval-unknown-names", cipr_eval("names=[both]", "backend=replay"), "got 'both'"),
    Case("eval-unknown-perturbation",
         cipr_eval("perturbations=[nope]", "backend=replay", "limit=1"), "'nope'"),
    Case("eval-unknown-partition", cipr_eval("partitions=[nope]", "backend=replay", "limit=1"), "nope"),
    Case("eval-unknown-format", cipr_eval("format=nope", "backend=replay", "limit=1"), "format='nope'"),
    Case("eval-data-root-missing", cipr_eval("data_root={w}/nowhere", "backend=replay", "limit=1"),
         "nowhere/bfcl_v4"),
    Case("eval-bad-manifest", cipr_eval("model={w}/bad_manifest"), "field 'version'", setup=_bad_manifest),
    Case("eval-rerun-other-configuration",
         cipr_eval("backend=replay", "limit=2", "partitions=[simple_python]",
                   "perturbations=[original]", "seed=1", "out_dir={w}/evals/a"),
         "another configuration"),
    Case("eval-smaller-rerun-into-older-folder",
         cipr_eval("backend=replay", "limit=1", "partitions=[simple_python]",
                   "perturbations=[original]", "out_dir={w}/evals/a"),
         "does not select"),
    Case("eval-garbage-results-line", cipr_eval("backend=replay", "limit=2", "partitions=[simple_python]",
                                                "perturbations=[original]", "out_dir={w}/evals/torn_middle"),
         "not a result record", setup=_bad_results),
    Case("eval-out-dir-is-a-file", cipr_eval_main("backend=replay", "out_dir={w}/notes.txt"), "is a file"),
    # cipr-eval-compare
    Case("compare-missing-run", cipr_compare("run_a={w}/evals/a", "run_b={w}/evals/none"),
         "no results.jsonl"),
    Case("compare-out-is-a-run", cipr_compare("run_a={w}/evals/a", "run_b={w}/evals/b", "out={w}/evals/a"),
         "is the source"),
    Case("compare-garbage-run-json", cipr_compare("run_a={w}/evals/a", "run_b={w}/evals/bad_meta"),
         "not valid JSON", setup=_bad_results),
    # cipr-train
    Case("train-negative-learning-rate", cipr_train("trainer.learning_rate=-1e-5"), "trainer.learning_rate"),
    Case("train-zero-learning-rate", cipr_train("trainer.learning_rate=0"), "trainer.learning_rate"),
    Case("train-zero-max-steps", cipr_train("trainer.max_steps=0"), "trainer.max_steps"),
    Case("train-run-dir-is-a-file", cipr_train("trainer.run_dir={w}/notes.txt"), "is a file"),
    Case("train-missing-model-folder", cipr_train(model="{w}/no_model"), "no_model"),
    Case("train-missing-data-file", cipr_train("data=toolrl", "data.path={w}/none.parquet"), "none.parquet"),
    Case("train-resume-not-a-checkpoint", cipr_train("trainer.resume={w}/user_folder"), "trainer.resume"),
    Case("train-garbage-latest-json", cipr_train("trainer.run_dir={w}/runs/garbage"), "latest.json",
         watch=("{w}/runs/garbage/sft",), setup=_garbage_tracker),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.integration
def test_bad_input_is_one_clear_line_and_changes_nothing(case, work, capsys, monkeypatch):
    monkeypatch.chdir(work)
    monkeypatch.delenv("CIPR_DEBUG", raising=False)
    (work / "runs").mkdir(exist_ok=True)
    if case.setup is not None:
        case.setup(work)
    watched = [Path(p.format(w=work)) for p in case.watch]
    before = tree_digest(*watched)
    capsys.readouterr()
    try:
        code = case.call(work)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("cipr-")]
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1 and case.message in lines[0], err
    assert tree_digest(*watched) == before


@pytest.mark.integration
@pytest.mark.parametrize("argv, message", [
    (["cipr-data", "export", "source=bfcl", "limit=-1", "out={w}/x.jsonl"], "limit=-1"),
    (["cipr-export", "run_dir={w}/run", "out_dir={w}/run", "overwrite=true"], "is the source"),
    (["cipr-eval", "model=runs/no_such_model", "out_dir={w}/evals/sub"], "no_such_model"),
    (["cipr-train", "trainer.run_dir={w}/notes.txt"], "is a file"),
])
def test_console_scripts_answer_bad_input_with_one_line(argv, message, work):
    before = tree_digest(work)
    exe = Path(sys.executable).parent / argv[0]
    proc = subprocess.run([str(exe), *(a.format(w=work) for a in argv[1:])], capture_output=True, text=True,
                          cwd=work, timeout=300, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and message in proc.stderr
    after = tree_digest(work)
    assert {k: after.get(k) for k in before} == before


def test_debug_shows_the_traceback(work, capsys):
    from cipr.cli.data import main

    with pytest.raises(Exception, match="limit=-1"):
        main(["export", "source=bfcl", "limit=-1", f"out={work / 'x.jsonl'}", "--debug"])


# ---------------------------------------------------------------- checkpoint integrity on resume


def test_truncated_newest_checkpoint_resumes_from_the_previous_one(work, tmp_path, caplog):
    from cipr.train.checkpoint import latest_complete
    from cipr.train.run import config_from_dict, run

    run_dir = tmp_path / "run"
    shutil.copytree(work / "run", run_dir)
    stage = run_dir / "sft"
    for f in ("stage.json",):
        (stage / f).unlink()
    shutil.rmtree(stage / "final")
    weights = stage / "checkpoint-3" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with caplog.at_level("WARNING"):
        assert latest_complete(stage) == stage / "checkpoint-2"
    assert str(stage / "checkpoint-3") in caplog.text and "model.safetensors is truncated" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):
        run(config_from_dict(train_config(run_dir, work / "plain", steps=3)))
    assert "resuming sft from " + str(stage / "checkpoint-2") in caplog.text
    assert (stage / "stage.json").is_file() and latest_complete(stage) == stage / "checkpoint-3"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "step"] == [1, 2, 3]
    assert sum(r["kind"] == "stage_end" for r in records) == 1


def test_damaged_files_and_trackers_are_detected(work, tmp_path, caplog):
    from cipr.core.errors import DataError
    from cipr.train.checkpoint import checkpoint_problem, latest_complete

    stage = tmp_path / "sft"
    shutil.copytree(work / "run" / "sft", stage)
    assert checkpoint_problem(stage / "checkpoint-3") is None
    optimizer = stage / "checkpoint-3" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:-200])
    assert "optimizer.pt is truncated" in checkpoint_problem(stage / "checkpoint-3")
    (stage / "checkpoint-2" / "trainer_state.json").write_text("{")
    assert "trainer_state.json" in checkpoint_problem(stage / "checkpoint-2")
    assert latest_complete(stage) == stage / "checkpoint-1"  # newest complete below the damaged ones
    (stage / "latest.json").write_text("garbage")
    with caplog.at_level("WARNING"):
        assert latest_complete(stage) == stage / "checkpoint-1"
    assert str(stage / "latest.json") in caplog.text
    (stage / "checkpoint-1" / "cipr_state.pt").unlink()
    with pytest.raises(DataError, match="no earlier complete checkpoint"):
        latest_complete(stage)


# ---------------------------------------------------------------- cipr.core.io


def test_atomic_write_leaves_nothing_on_failure_and_honours_the_umask(tmp_path):
    import os
    import stat

    from cipr.core.io import atomic_write, write_text_atomic

    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(target) as f:
        f.write("half")
        raise RuntimeError("killed")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    old = os.umask(0o027)
    try:
        write_text_atomic(tmp_path / "new.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o640


def test_missing_model_fails_at_once_without_the_network(tmp_path, monkeypatch):
    from cipr.core.errors import ConfigError
    from cipr.runtime.hub import looks_like_path, resolve_model

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert looks_like_path("runs/no_such_model") and looks_like_path("./m") and \
        not looks_like_path("org/model")
    with pytest.raises(ConfigError, match="no such folder"):
        resolve_model("runs/no_such_model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE=0"):
        resolve_model("nobody-here/no-model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert resolve_model("nobody-here/no-model") == "nobody-here/no-model"  # the user allowed downloads
