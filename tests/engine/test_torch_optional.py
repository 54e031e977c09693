"""torch stays optional: with it blocked, the CLI, the emulated engine and every module outside
the real-model engine import and work, and `verify-model` fails with a one-line hint.

Deliberately *not* marked `model`: it needs no torch, and it is the check that matters most on a
machine without the model extra.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Setting sys.modules["torch"] = None makes every `import torch` raise ImportError.
_PRELUDE = "import sys; sys.modules['torch'] = None\n"

# Modules of testbed.engine.torch that compute with tensors, hence may import torch.
_TORCH_MODULES = {"model", "kvstate", "codec", "prefix", "engine", "verify", "batched"}

_SCRIPT = (
    _PRELUDE
    + """
import importlib, pkgutil
import testbed
from testbed.cli import main
from testbed.engine.emulated import DecodeBatcher, PrefillEngine

skipped = []
for info in pkgutil.walk_packages(testbed.__path__, "testbed."):
    name = info.name
    if name.startswith("testbed.engine.torch.") and name.rsplit(".", 1)[1] in TORCH:
        skipped.append(name)
        continue
    importlib.import_module(name)
assert sys.modules["torch"] is None, "something replaced the torch block"
assert len(skipped) == len(TORCH), skipped
sys.exit(main(["plan", "scenarios/paper.yaml"]))
""".replace("TORCH", repr(_TORCH_MODULES))
)


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_cli_emulated_engine_and_plan_work_without_torch() -> None:
    out = _python(_SCRIPT)
    assert out.returncode == 0, out.stderr
    assert "lambda_max" in out.stdout


def test_verify_model_without_torch_is_a_clear_user_error() -> None:
    out = _python(_PRELUDE + "from testbed.cli import main; sys.exit(main(['verify-model']))")
    assert out.returncode == 2, out.stderr
    assert "verify-model needs torch" in out.stderr
    assert "Traceback" not in out.stderr


def test_torch_scenario_without_torch_fails_with_one_clear_line(tmp_path: Path) -> None:
    argv = ["run", "scenarios/real-model.yaml", "--quiet", "--out", str(tmp_path)]
    code = _PRELUDE + f"from testbed.cli import main\nsys.exit(main({argv!r}))"
    out = _python(code)
    assert out.returncode == 2, out.stderr
    assert "pip install 'prfaas-testbed[model]'" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "logs").exists()  # refused before any process started
