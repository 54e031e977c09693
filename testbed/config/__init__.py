"""Typed configuration: deployment, link, workload, scale and policy, read from YAML.

Every quantity a person writes carries its unit ("100Gbps", "25ms", "19.4K"); the models turn them
into SI floats at the boundary so nothing downstream handles strings. Unknown fields are errors
(a typo must not silently fall back to a default), and every error names the file and the field
or line, because that is what a person needs to fix it.

One module per part: `base` (unit-typed fields, the strict base model), `deployment`,
`workload`, `policy` (SLO, policy, scheduler loops, planner), `files` (reading YAML). The
scenario file that puts them together with a nemesis timeline and checkers is
testbed.scenario.schema (`Scenario`, `load_scenario`): it needs the registered faults and
checkers, which sit above this package in the import layers.
"""

from __future__ import annotations

from testbed.config.base import (
    STRICT_UNITS,
    Bandwidth,
    Duration,
    PositiveDuration,
    Size,
    StrictModel,
    Tokens,
    literal_values,
    tagged_union,
)
from testbed.config.deployment import (
    ClusterConfig,
    DeploymentConfig,
    DeploymentKind,
    LinkConfig,
    ScaleConfig,
    TinyModelConfig,
)
from testbed.config.files import MAX_YAML_BYTES, load_yaml
from testbed.config.policy import (
    LongTermConfig,
    PlannerConfig,
    PolicyConfig,
    ShortTermConfig,
    SloConfig,
)
from testbed.config.workload import (
    ArrivalsConfig,
    FixedLengths,
    LengthsConfig,
    LognormalLengths,
    ShiftConfig,
    TraceLengths,
    WorkloadConfig,
)

__all__ = [
    "MAX_YAML_BYTES",
    "STRICT_UNITS",
    "ArrivalsConfig",
    "Bandwidth",
    "ClusterConfig",
    "DeploymentConfig",
    "DeploymentKind",
    "Duration",
    "FixedLengths",
    "LengthsConfig",
    "LinkConfig",
    "LognormalLengths",
    "LongTermConfig",
    "PlannerConfig",
    "PolicyConfig",
    "PositiveDuration",
    "ScaleConfig",
    "ShiftConfig",
    "ShortTermConfig",
    "Size",
    "SloConfig",
    "StrictModel",
    "TinyModelConfig",
    "Tokens",
    "TraceLengths",
    "WorkloadConfig",
    "literal_values",
    "load_yaml",
    "tagged_union",
]
