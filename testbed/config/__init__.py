"""Typed configuration: deployment, link, workload, scale, policy and scenario, read from YAML.

Every quantity a person writes carries its unit ("100Gbps", "25ms", "19.4K"); the models turn them
into SI floats at the boundary so nothing downstream handles strings. Unknown fields are errors
(a typo must not silently fall back to a default), and every error names the file and the field
or line, because that is what a person needs to fix it.

One module per part: `base` (unit-typed fields, the strict base model), `deployment`,
`workload`, `policy` (SLO, policy, scheduler loops, planner), `files` (reading YAML).
"""

from __future__ import annotations

from testbed.config.base import (
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
from testbed.config.scenario import (
    NEMESIS_TARGET_GROUPS,
    CheckerConfig,
    NemesisEvent,
    Scenario,
    load_scenario,
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
    "NEMESIS_TARGET_GROUPS",
    "ArrivalsConfig",
    "Bandwidth",
    "CheckerConfig",
    "ClusterConfig",
    "DeploymentConfig",
    "DeploymentKind",
    "Duration",
    "FixedLengths",
    "LengthsConfig",
    "LinkConfig",
    "LognormalLengths",
    "LongTermConfig",
    "NemesisEvent",
    "PlannerConfig",
    "PolicyConfig",
    "PositiveDuration",
    "ScaleConfig",
    "Scenario",
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
    "load_scenario",
    "load_yaml",
    "tagged_union",
]
