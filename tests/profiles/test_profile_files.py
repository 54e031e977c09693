"""#17 item 5: a user's model and hardware from a profile file, used by the planner, the
engines and every service process of a run."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.config.profiles import ProfileFile, load_profile_file, to_profiles
from testbed.errors import ConfigError
from testbed.profiles import HARDWARE, MODELS
from testbed.scenario.library import LIBRARY_DIR
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import load_scenario
from testbed.scheduler.spec import SchedulerSpec
from testbed.services.host import load_spec
from testbed.services.spec import ServiceSpec

_names = itertools.count()


def doc(**over: object) -> dict[str, object]:
    """A profile document (SI numbers: what Python callers pass) with a fresh model name."""
    base: dict[str, object] = {
        "model": {
            "name": f"test-model-{next(_names)}",
            "layers": {"full": 4},
            "kv": {"per_token": 1000.0},
        },
        "hardware": {
            "testhw": {
                "prefill": [{"tokens": 1000, "time": 0.1}, {"tokens": 10000, "time": 2.0}],
                "decode": {"step_base": 0.02, "step_per_seq": 0.001},
            }
        },
    }
    for key, value in over.items():
        section, _, field = key.partition("__")
        if not field:
            base[section] = value
            continue
        target = base[section]
        assert isinstance(target, dict)
        target[field] = value
    return base


def profiles(**over: object):  # type: ignore[no-untyped-def]
    return to_profiles(ProfileFile.model_validate(doc(**over)))


def test_layers_split_into_full_and_linear_kinds() -> None:
    model, _ = profiles(
        model__layers={"full": 2, "linear": 6}, model__kv={"per_token": 10.0, "state": 600.0}
    )
    assert model.layer_kinds == ("linear", "linear", "linear", "full") * 2
    sizes = model.layer_bytes(100)  # 600 state over 6 linear layers, 1000 over 2 full ones
    assert [sizes[i] for i in (0, 3)] == [100, 500]
    assert sum(sizes) == 1600


def test_kv_per_token_and_state_set_the_kv_size() -> None:
    model, _ = profiles(model__kv={"per_token": 2048.0})
    assert model.kv_bytes(1000) == pytest.approx(2_048_000)
    with_state, _ = profiles(
        model__layers={"full": 1, "linear": 3}, model__kv={"per_token": 2048.0, "state": 1e6}
    )
    assert with_state.kv_bytes(1000) == pytest.approx(3_048_000)
    assert with_state.state_bytes == 1e6


def test_kv_curve_knots_set_the_kv_size() -> None:
    model, _ = profiles(
        model__kv={"curve": [{"tokens": 1000, "size": 1e6}, {"tokens": 3000, "size": 5e6}]}
    )
    assert model.kv_bytes(2000) == pytest.approx(3e6)
    with pytest.raises(ValueError, match="exactly one of per_token or curve"):
        profiles(
            model__kv={
                "per_token": 1.0,
                "curve": [{"tokens": 1, "size": 1}, {"tokens": 2, "size": 2}],
            }
        )


def test_prefill_knots_set_the_prefill_time() -> None:
    model, _ = profiles()
    assert model.prefill_time("testhw", 5500) == pytest.approx(1.05)
    with pytest.raises(ValueError, match="strictly increasing"):
        profiles(hardware={"h": {"prefill": [{"tokens": 5, "time": 1}, {"tokens": 5, "time": 2}]}})


def test_decode_sets_the_step_model_and_batch() -> None:
    model, _ = profiles()
    d = model.decode["testhw"]
    assert d.step_time(10) == pytest.approx(0.03)
    assert d.bs_max(0.025) == 5
    capped, _ = profiles(
        hardware={"testhw": {"decode": {"step_base": 0.02, "step_per_seq": 0.0, "max_batch": 7}}}
    )
    assert capped.decode["testhw"].bs_max(0.025) == 7
    assert "testhw" not in capped.prefill  # no knots: cannot prefill there


def test_gpus_and_descriptions_name_the_hardware() -> None:
    _, hw = profiles(
        hardware={"big": {"gpus": 72, "description": "a rack", "decode": {"step_base": 0.01}}}
    )
    assert (hw[0].name, hw[0].gpus, hw[0].description) == ("big", 72, "a rack")
    model, _ = profiles(model__description="mine")
    assert model.description == "mine"


def test_a_scenario_plans_and_prepares_with_a_user_profile() -> None:
    """ModelEntry.name is what a deployment names; the planner uses the file's curves, and the
    GPU count comes from the hardware entries."""
    sc = load_scenario(LIBRARY_DIR / "custom-profile.yaml")
    assert [p.model.name for p in sc.profiles] == ["dense-70b"]
    assert MODELS["dense-70b"].kv_bytes(1000) == pytest.approx(1000 * 320 * 1024)
    rp = prepare_run(sc, RunOptions(out_dir=Path("unused"), progress=False))
    assert rp.plan.gpus == (2 + 6) * 8 == HARDWARE["a100x8"].gpus * 8
    paper = load_scenario(LIBRARY_DIR / "burst.yaml")
    other = prepare_run(paper, RunOptions(out_dir=Path("unused"), progress=False))
    assert rp.plan.lambda_max_rps != pytest.approx(other.plan.lambda_max_rps)


def test_services_register_the_profiles_their_spec_carries() -> None:
    d = ProfileFile.model_validate(doc())
    name = d.model.name
    assert name not in MODELS
    spec = ServiceSpec(role="decode", id="d0", model=name, hardware="testhw", profiles=[d])
    loaded = load_spec(spec.model_dump_json())
    assert loaded.profiles == [d]
    assert MODELS[name].decode["testhw"].step_time(1) == pytest.approx(0.021)


def test_a_router_spec_whose_scheduler_names_user_profiles_loads_in_a_fresh_process(
    tmp_path: Path,
) -> None:
    """The router's scheduler section names the deployment's model and hardware, so the spec's
    profiles must be registered before that section is validated (a replanning policy on a
    user profile used to stop the router at start-up: "unknown model profile")."""
    sc = load_scenario(LIBRARY_DIR / "custom-profile.yaml")
    dep = sc.deployments["prfaas-pd"]
    spec = ServiceSpec(
        role="router",
        id="router",
        model=dep.model,
        profiles=list(sc.profiles),
        scheduler=SchedulerSpec(
            deployment=dep,
            lengths=sc.workload.lengths,
            output_tokens=sc.workload.output_tokens,
            tpot_slo_s=sc.slo.tpot,
            threshold_step=sc.planner.threshold_step,
            n_prefill=2,
        ),
    )
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json())
    code = (
        "import sys; from pathlib import Path; from testbed.services.host import load_spec\n"
        "s = load_spec(Path(sys.argv[1]).read_text())\n"
        "print(s.scheduler.deployment.model, s.scheduler.deployment.local.hardware)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [dep.model, dep.local.hardware]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "p.yaml"
    p.write_text(text)
    return p


GOOD = """\
model: {{name: {name}, layers: {{full: 2}}, kv: {{per_token: {kv}}}}}
hardware:
  testhw2: {{gpus: 4, decode: {{step_base: {base}}}}}
"""


def test_a_profile_file_needs_units_and_names_its_file_and_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_profile_file(write(tmp_path, GOOD.format(name="u1", kv="1KiB", base="20")))
    assert str(err.value).startswith(f"{tmp_path / 'p.yaml'}: hardware.testhw2.decode.step_base: ")
    assert "has no unit" in str(err.value)
    with pytest.raises(ConfigError, match=r"model\.layerz: unknown field; did you mean .layers."):
        load_profile_file(
            write(
                tmp_path, GOOD.format(name="u1", kv="1KiB", base="20ms").replace("layers", "layerz")
            )
        )


def test_a_name_that_means_something_else_is_refused(tmp_path: Path) -> None:
    text = GOOD.format(name="internal-1t-hybrid", kv="1KiB", base="20ms")
    with pytest.raises(
        ConfigError, match="model 'internal-1t-hybrid' is already defined differently"
    ):
        load_profile_file(write(tmp_path, text))
    ok = GOOD.format(name="u2", kv="1KiB", base="20ms")
    assert load_profile_file(write(tmp_path, ok)).model.name == "u2"
    assert load_profile_file(write(tmp_path, ok)).model.name == "u2"  # the same again: harmless
    with pytest.raises(ConfigError, match="already defined differently"):
        load_profile_file(write(tmp_path, GOOD.format(name="u2", kv="2KiB", base="20ms")))
    with pytest.raises(ConfigError, match="hardware 'h20x8' is already defined with 8 GPUs, not 4"):
        load_profile_file(write(tmp_path, ok.replace("u2", "u3").replace("testhw2", "h20x8")))
