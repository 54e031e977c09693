"""Toxics: one module per fault type, all behind testbed.link.toxics.base.Toxic.

`REGISTRY` maps the API's type names to classes. Toxiproxy's toxics keep their names and
attributes; `link_bandwidth` is this emulator's extension (see docs/link.md).
"""

from __future__ import annotations

from types import MappingProxyType

from testbed.link.toxics.bandwidth import BandwidthToxic
from testbed.link.toxics.base import STREAMS, Attr, Toxic, ToxicWrapper, directions_of
from testbed.link.toxics.latency import LatencyToxic
from testbed.link.toxics.limit_data import LimitDataToxic
from testbed.link.toxics.link_bandwidth import LinkBandwidthToxic
from testbed.link.toxics.noop import NoopToxic
from testbed.link.toxics.reset_peer import ResetPeerToxic
from testbed.link.toxics.slicer import SlicerToxic
from testbed.link.toxics.slow_close import SlowCloseToxic
from testbed.link.toxics.timeout import TimeoutToxic

__all__ = [
    "REGISTRY",
    "STREAMS",
    "Attr",
    "BandwidthToxic",
    "LatencyToxic",
    "LimitDataToxic",
    "LinkBandwidthToxic",
    "NoopToxic",
    "ResetPeerToxic",
    "SlicerToxic",
    "SlowCloseToxic",
    "TimeoutToxic",
    "Toxic",
    "ToxicWrapper",
    "directions_of",
]

REGISTRY: MappingProxyType[str, type[Toxic]] = MappingProxyType(
    {
        cls.type_name: cls
        for cls in (
            NoopToxic,
            LatencyToxic,
            BandwidthToxic,
            SlowCloseToxic,
            TimeoutToxic,
            ResetPeerToxic,
            SlicerToxic,
            LimitDataToxic,
            LinkBandwidthToxic,
        )
    }
)
