"""toy_cross_dc: at least `min_fraction` of the completed requests had their KV cross the link;
a toy checker (tests/test_extension_toys.py copies it to testbed/checkers/).

```yaml
checkers: [{check: toy_cross_dc, min_fraction: 0.2}]
```
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from testbed.checkers.base import CheckerConfig, CheckInput, checker
from testbed.checkers.result import CheckResult, vacuous


class ToyCrossDcCheck(CheckerConfig):
    check: Literal["toy_cross_dc"] = "toy_cross_dc"
    min_fraction: float = Field(0.0, ge=0, le=1)


EVIDENCE = {
    "ToyCrossDcCheck.check": "tests/test_toys.py::test_the_checker_bounds_the_share",
    "ToyCrossDcCheck.min_fraction": "tests/test_toys.py::test_the_checker_bounds_the_share",
}


@checker(ToyCrossDcCheck)
def toy_cross_dc(cfg: ToyCrossDcCheck, run: CheckInput) -> CheckResult:
    completed = [r for r in run.records if r.status == "completed"]
    if not completed:
        return vacuous("toy_cross_dc", "no completed request: no share to bound")
    share = sum(r.cross_dc for r in completed) / len(completed)
    detail = f"{share:.1%} of {len(completed)} completed crossed (at least {cfg.min_fraction:.0%})"
    return CheckResult("toy_cross_dc", share >= cfg.min_fraction, detail)
