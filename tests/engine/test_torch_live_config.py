"""`engine: torch` configuration: mistakes are one-line errors naming the file and the field.

Needs no torch (the checks are about the schema), so it is not marked `model`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed.engine.torch import live
from testbed.engine.torch.config import TinyConfig
from testbed.errors import ConfigError
from testbed.scenario.schema import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, edit: dict[str, object]) -> Path:
    doc = yaml.safe_load((ROOT / "scenarios" / "real-model.yaml").read_text())
    for dotted, value in edit.items():
        *parents, last = dotted.split(".")
        node = doc
        for p in parents:
            node = node[p]
        node[last] = value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_real_model_scenario_loads_with_torch_engine() -> None:
    sc = load_scenario(ROOT / "scenarios" / "real-model.yaml")
    dep = sc.deployments["prfaas-pd"]
    assert dep.engine == "torch" and sc.scale.byte_scale == 1
    assert {c.check for c in sc.checkers} >= {"token_exact", "failures"}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"scale.byte_scale": 8}, "scale.byte_scale: must be 1 when deployments.prfaas-pd"),
        ({"workload.lengths.max": 8000}, "workload.lengths.max: 8000 prompt tokens"),
        ({"deployments.prfaas-pd.engine": "cuda"}, "deployments.prfaas-pd.engine: Input should"),
        (
            {"deployments.prfaas-pd.engine": "emulated"},
            "checkers.0.check: token_exact needs a deployment with engine: torch",
        ),
        ({"deployments.prfaas-pd.tiny_model": {"seed": 1, "x": 2}}, "tiny_model.x: unknown"),
    ],
)
def test_torch_config_errors_name_file_and_field(
    tmp_path: Path, edit: dict[str, object], message: str
) -> None:
    path = _write(tmp_path, edit)
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    text = str(err.value)
    assert text.startswith(f"{path}: "), text
    assert message in text, text


def test_prompts_are_reproducible_and_depend_on_id_length_and_seed() -> None:
    vocab = TinyConfig().vocab_size
    a = live.prompt_ids(3, "r000001", 50, vocab)
    assert a == live.prompt_ids(3, "r000001", 50, vocab)
    assert len(a) == 50 and all(0 <= t < vocab for t in a)
    assert a != live.prompt_ids(4, "r000001", 50, vocab)
    assert a != live.prompt_ids(3, "r000002", 50, vocab)
    assert a[:10] != live.prompt_ids(3, "r000001", 51, vocab)[:10]
    assert live.ids_digest(a) == live.ids_digest(list(a)) != live.ids_digest(a[:-1])
