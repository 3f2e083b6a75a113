"""The one config loader (cipr/core/config.py) as every command uses it: typo hints, Literal choices,
types."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from cipr.core.config import ConfigError, from_dict, from_overrides
from cipr.eval.config import eval_config_from_dict
from cipr.train.run import config_from_dict as train_config


@pytest.mark.parametrize("load, data, message", [
    (eval_config_from_dict, {"limt": 3}, "unknown config key 'limt'. Did you mean 'limit'?"),
    (eval_config_from_dict, {"backend": "vlm"},
     "'backend' must be one of 'auto', 'hf', 'vllm', 'openai', 'replay'"),
    (eval_config_from_dict, {"benchmark": {"name": "bfcl_v4"}}, "'benchmark.name' must be one of"),
    (eval_config_from_dict, {"names": ["orignal"]}, "'names[0]' must be one of 'original', 'canonical'"),
    (eval_config_from_dict, {"openai": {"timeout": 3}}, "'openai.timeout'. Did you mean 'timeout_s'?"),
    (eval_config_from_dict, {"batch_size": "8"}, "'batch_size' must be an integer"),
    (train_config, {"trainer": {"learning_rat": 1e-5}},
     "'trainer.learning_rat'. Did you mean 'learning_rate'?"),
    (train_config, {"algo": {"name": "ppo"}}, "'algo.name' must be one of"),
    (train_config, {"algo": {"name": "distill", "eval": {"live_env": "shop"}}},
     "'algo.eval.live_env' must be one of"),
    (train_config, {"algo": {"name": "distill"}, "trainer": {"max_steps": True}},
     "'trainer.max_steps' must be an integer"),
])
def test_every_command_refuses_bad_keys_and_values_the_same_way(load, data, message):
    with pytest.raises(ConfigError) as e:
        load(data)
    assert message in str(e.value)


def test_numbers_widen_to_float_and_lists_become_tuples_where_declared():
    from dataclasses import dataclass

    @dataclass
    class Probe:
        rate: float = 0.5
        sizes: tuple[int, ...] = (1,)

    got = from_dict(Probe, {"rate": 1, "sizes": [2, 3]})
    assert got == Probe(rate=1.0, sizes=(2, 3)) and isinstance(got.rate, float)



@dataclass
class Inner:
    k: int = 1


@dataclass
class Opts:
    names: list[str] = field(default_factory=list)
    url: str | None = "x"
    port: int = 0
    rate: float = 1.0
    on: bool = False
    inner: Inner = field(default_factory=Inner)


def test_from_overrides_reads_key_values_as_the_hydra_commands_spell_them():
    got = from_overrides(Opts, ["names=[original,canonical]", "url=null", "port=8001", "rate=2", "on=true",
                                "inner.k=3"])
    assert got == Opts(["original", "canonical"], None, 8001, 2.0, True, Inner(3))
    assert from_overrides(Opts, ["url=http://127.0.0.1:8001/v1"]).url == "http://127.0.0.1:8001/v1"
    for argv, message in ((["prot=1"], "Did you mean 'port'"), (["port=x"], "'port' must be an integer"),
                          (["port"], "cannot read the option 'port'"), (["port=1,2"], "only plain key=value"),
                          (["+port=1"], "only plain key=value"),
                          (["inner=1", "inner.k=2"], "both as a value")):
        with pytest.raises(ConfigError, match=message):
            from_overrides(Opts, argv)
