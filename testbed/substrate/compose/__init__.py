"""The compose substrate: containers as emulated datacenters.

Topology of one run (project `prfaas-NAME-xxxxxx`):

    host: runner ──127.0.0.1:ports──> ctl network (icc off: host <-> container only)
                                          │
    prfaas network (internal)             │            local network (internal)
      prfaas-prefill-i ──KV──> link :10000+j ──KV──> local-decode-j :9000
                         <──HTTP── link :11000+i <──HTTP── router
                               (link container)           local-prefill-i ──KV──> decode

The link container (the link emulator, `testbed link serve`, with NET_ADMIN for tc) is the
only member of both datacenter networks, so every byte between them crosses its proxies: KV
proxies `xdc-<decode>` carry the shared link cap and the RTT toxics exactly as on the local
substrate; control proxies `ctl-<prefill>` let the router reach PrfaaS prefill instances
(untouched by toxics, as control traffic is on the local substrate). The `ctl` network only
carries the runner's traffic: each container publishes its HTTP port on 127.0.0.1 and
containers cannot talk to each other over it.

The standing topology (networks and link container) comes up with `docker compose` or
`docker-compose` from compose/docker-compose.yml, rendered into results/NAME/compose.yml with
its .env; instances are containers started through the Docker API into the same networks, and
the rendered file lists them too (profile `deployment`) so the deployment can be stood up by
hand. Faults map to the Docker API: kill, pause, restart, network disconnect.

The package: `images` (base and testbed images, cached; the Docker client), `topology`
(networks, subnets, the link container, cleanup of a run or of what dead runners left) and
`substrate` (ComposeSubstrate). `python -m testbed.substrate.compose images|down` (what
`make images` / `make down` run) builds the images and removes every container, network and
volume of the project.
"""

from testbed.substrate.compose.images import IMAGE, LABEL, docker_client, ensure_images
from testbed.substrate.compose.substrate import ComposeSubstrate
from testbed.substrate.compose.topology import (
    RUN_LABEL,
    compose_command,
    down,
    leftovers,
    reap_orphans,
)

__all__ = [
    "IMAGE",
    "LABEL",
    "RUN_LABEL",
    "ComposeSubstrate",
    "compose_command",
    "docker_client",
    "down",
    "ensure_images",
    "leftovers",
    "reap_orphans",
]
