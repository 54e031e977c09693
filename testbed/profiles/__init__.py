"""Model and hardware profiles: data tables from the paper plus linear interpolation."""

from testbed.profiles.base import Curve, DecodeProfile, HardwareProfile, ModelProfile
from testbed.profiles.paper import HARDWARE, MODELS

__all__ = ["HARDWARE", "MODELS", "Curve", "DecodeProfile", "HardwareProfile", "ModelProfile"]
