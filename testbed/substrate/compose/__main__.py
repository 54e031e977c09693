"""`python -m testbed.substrate.compose images [--prometheus]|down`: what `make images` and
`make down` run."""

from __future__ import annotations

import argparse
import sys
import time

from testbed.errors import UserError
from testbed.substrate.compose.images import ensure_images
from testbed.substrate.compose.prometheus import ensure_prometheus_image
from testbed.substrate.compose.topology import down, leftovers


def build_parser() -> argparse.ArgumentParser:
    """The command's parser (tests/test_no_silent_fields.py reads its flags)."""
    parser = argparse.ArgumentParser(
        prog="python -m testbed.substrate.compose", description="compose substrate images"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    img = sub.add_parser("images", help="build the base and testbed images (cached)")
    img.add_argument("--force", action="store_true", help="rebuild even when current")
    img.add_argument(
        "--prometheus",
        action="store_true",
        help="also build the Prometheus server image (testbed up --prometheus)",
    )
    dn = sub.add_parser("down", help="remove every container, network and volume of the project")
    dn.add_argument("--run", help="only this run (its compose project name)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "images":
            t = time.monotonic()
            tag = ensure_images(force=args.force)
            print(f"{tag} ready ({time.monotonic() - t:.1f}s)")
            if args.prometheus:
                t = time.monotonic()
                tag = ensure_prometheus_image(force=args.force)
                print(f"{tag} ready ({time.monotonic() - t:.1f}s)")
        else:
            removed = down(args.run)
            print("removed: " + ", ".join(f"{n} {k}" for k, n in removed.items()))
            left = leftovers(args.run)
            if any(left.values()):
                print(f"still present: {left}", file=sys.stderr)
                return 1
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
