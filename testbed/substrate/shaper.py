"""Which shaper caps a run's link, checked before anything starts (`link.shaper`).

`emulator`: the link emulator's shared `link_bandwidth` toxic (testbed.link.deployment).
`tc`: the kernel, where the substrate's entry says (testbed.substrates, `kernel_shaper`): on
the local substrate through the run's namespaces and veth (testbed.link.netns_link), on compose
in the link container. A machine that cannot shape in the kernel stops a `tc` run here with one
line naming what is missing, never by falling back to the emulator.
"""

from __future__ import annotations

from testbed.config import LinkConfig
from testbed.errors import UserError
from testbed.substrates import substrate_facts

__all__ = ["preflight_shaper"]


def preflight_shaper(substrate: str, link: LinkConfig) -> str:
    """Check `link.shaper` can run on `substrate`; returns one line for the run header."""
    if link.shaper == "emulator":
        return "emulator (link_bandwidth toxic, one cap shared by every proxy)"
    kernel = substrate_facts(substrate).kernel_shaper
    if kernel == "netns":
        from testbed.link.netns_link import preflight

        netem = preflight()
        latency = (
            "sch_netem present but not used: latency and jitter from the emulator"
            if netem
            else "no sch_netem: latency and jitter from the emulator"
        )
        return f"tc (htb on a veth between the run's network namespaces; {latency})"
    if kernel == "container":
        return (
            "tc (htb in the link container toward the local datacenter; latency and jitter "
            "from the emulator)"
        )
    raise UserError(f"link.shaper tc is not available on the {substrate} substrate")
