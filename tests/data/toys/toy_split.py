"""toy-split: prompts up to `local_max` tokens prefill on PD-P, longer ones on PrfaaS; decode on
the least-loaded local decode instance. A toy policy with a knob (tests/test_extension_toys.py
copies it to testbed/policy/ and runs the fast suite): its knobs are the scenario's
`policy.toy_split`, declared here and nowhere else.

```yaml
policy: {name: toy-split, toy_split: {local_max: 2000}}
```
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from testbed.config import DeploymentKind
from testbed.config.policy import PolicyConfig, PolicyKnobs
from testbed.policy.base import POLICIES, RequestView, Route, Snapshot, least_loaded


class ToySplitKnobs(PolicyKnobs):
    """`toy-split`'s knobs."""

    section: ClassVar[str] = "toy_split"
    local_max: int = Field(8000, gt=0)
    """Longest prompt (tokens) prefilled on PD-P."""


EVIDENCE = {"ToySplitKnobs.local_max": "tests/test_toys.py::test_the_knob_moves_the_split"}


@POLICIES.register
class ToySplit:
    name: ClassVar[str] = "toy-split"
    deployment_kind: ClassVar[DeploymentKind] = "prfaas-pd"
    needs_threshold: ClassVar[bool] = False
    replans: ClassVar[bool] = False
    long_term: ClassVar[bool] = False
    cache_aware: ClassVar[bool] = False
    config: ClassVar[type[ToySplitKnobs]] = ToySplitKnobs

    @classmethod
    def from_config(cls, config: PolicyConfig) -> ToySplit:
        return cls(config.knobs(ToySplitKnobs))

    def __init__(self, knobs: ToySplitKnobs | None = None) -> None:
        self.knobs = knobs or ToySplitKnobs()

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        cluster = "local" if request.input_tokens <= self.knobs.local_max else "prfaas"
        prefill = least_loaded(snapshot, cluster, "prefill")
        decode = least_loaded(snapshot, "local", "decode")
        return Route(prefill.cluster, prefill.id, decode.id, request.input_tokens)
