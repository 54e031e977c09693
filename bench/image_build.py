"""How long `make images` takes: the compose substrate's images rebuilt from nothing but the
cached wheels, then again when current.

    python bench/image_build.py --report bench/reports/compose.md

runs `python -m testbed.substrate.compose images --force` (the Debian base image with
mmdebstrap and `docker import`, then the testbed image on it, from the wheels already in
compose/.cache/: the download from PyPI is the network's, not measured here), then the same
without `--force` (what `make images` costs when nothing changed), each in a child process, and
prints the wall time of each with the images' sizes. `--prometheus` adds the Prometheus server
image to both. Needs a Docker engine; replaces the project's images, so run it with no compose
run up.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from provenance import reported, timed_child  # bench/: the script's directory is on sys.path

from testbed.substrate.compose.images import BASE_IMAGE, IMAGE
from testbed.substrate.compose.prometheus import PROMETHEUS_IMAGE


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--prometheus", action="store_true", help="the Prometheus image too")
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the table here")
    args = ap.parse_args()
    setup = "Docker engine on this machine; images built from Debian packages and cached wheels"
    reported(args.report, "image_build", "Image build times", setup, lambda: measure(args))
    return 0


def images(force: bool, prometheus: bool) -> float:
    """Wall seconds of one `python -m testbed.substrate.compose images` in a child."""
    cmd = [sys.executable, "-m", "testbed.substrate.compose", "images"]
    cmd += (["--force"] if force else []) + (["--prometheus"] if prometheus else [])
    return timed_child(cmd)


def size_mb(tag: str) -> str:
    """The image's size as `docker image inspect` reports it, in MB."""
    done = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Size}}", tag],
        capture_output=True,
        text=True,
    )
    return f"{int(done.stdout) / 1e6:.0f} MB" if done.returncode == 0 else "-"


def measure(args: argparse.Namespace) -> None:
    """Print the rebuild's and the no-op's wall time, then the images' sizes."""
    forced = images(True, args.prometheus)
    current = images(False, args.prometheus)
    what = "base, testbed" + (" and Prometheus" if args.prometheus else "") + " images"
    print(f"| `make images` | wall s ({what}) |")
    print("|---|---|")
    print(f"| rebuilt (`--force`; wheels cached) | {forced:.1f} |")
    print(f"| current (nothing changed) | {current:.1f} |")
    tags = [BASE_IMAGE, IMAGE] + ([PROMETHEUS_IMAGE] if args.prometheus else [])
    print("\nsizes: " + ", ".join(f"{t} {size_mb(t)}" for t in tags))


if __name__ == "__main__":
    raise SystemExit(main())
