"""The compose substrate's images: a Debian base from Debian packages, and the testbed on it.

The base image comes from mmdebstrap piped into `docker import` (no registry needed); the testbed
image adds the dependency wheels (downloaded from PyPI once per dependency set) and the source.
Both are cached: the testbed image carries a hash of its Dockerfile, wheels, source and base
image, so `make images` on a current tree returns in well under a second. This module also holds
what every part of the substrate needs from Docker: a client, and the label its objects carry.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.errors import UserError

__all__ = ["BASE_IMAGE", "IMAGE", "LABEL", "Log", "docker_client", "ensure_images", "log_stderr"]

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_DIR = ROOT / "compose"
CACHE_DIR = COMPOSE_DIR / ".cache"
IMAGE = "prfaas-testbed:latest"
BASE_IMAGE = "prfaas-testbed-base:bookworm"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
IMAGE_PYTHON = "3.11"
"""Python of the images (Debian bookworm's python3, and python:3.11-slim)."""

LABEL = "com.prfaas-testbed.project"
"""Every container, network, volume and image the testbed makes carries it (`make down`)."""
BUILD_TIMEOUT_S = 1800.0

Log = Callable[[str], None]


def log_stderr(msg: str) -> None:
    print(f"compose: {msg}", file=sys.stderr, flush=True)


def docker_client() -> Any:
    """A Docker SDK client (the `compose` extra, which `make install` installs)."""
    try:
        docker = importlib.import_module("docker")
    except ImportError:
        raise UserError(
            "the compose substrate needs the docker package: "
            "pip install 'prfaas-testbed[compose]' (make install does this)"
        ) from None
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        raise UserError(f"cannot reach the Docker engine: {exc}") from None
    return client


def _image_labels(client: Any, tag: str) -> dict[str, str] | None:
    errors = importlib.import_module("docker.errors")
    try:
        img = client.images.get(tag)
    except errors.ImageNotFound:
        return None
    return dict(img.labels or {})


# ---------------------------------------------------------------------------------- images


def build_base_image(client: Any, log: Log) -> None:
    """A Debian image from Debian packages: mmdebstrap piped into `docker import`."""
    if shutil.which("mmdebstrap") is None:
        if os.geteuid() == 0 and shutil.which("apt-get"):
            log("installing mmdebstrap (apt-get)")
            subprocess.run(
                ["apt-get", "install", "-y", "-q", "mmdebstrap"],
                check=True,
                timeout=600,
                stdout=subprocess.DEVNULL,
            )
        else:
            raise UserError(
                f"building {BASE_IMAGE} needs mmdebstrap (apt-get install mmdebstrap), or "
                "set TESTBED_BASE_IMAGE=python:3.11-slim where a registry is reachable"
            )
    log(f"building {BASE_IMAGE} with mmdebstrap ({DEBIAN_SUITE}; a few minutes)")
    with tempfile.TemporaryDirectory(prefix="prfaas-base-") as tmp:
        tar = Path(tmp) / "base.tar"
        subprocess.run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=minbase",
                "--include=python3,python3-venv,iproute2,ca-certificates",
                DEBIAN_SUITE,
                str(tar),
                DEBIAN_MIRROR,
            ],
            check=True,
            timeout=BUILD_TIMEOUT_S,
        )
        repo, tag = BASE_IMAGE.split(":")
        client.api.import_image_from_file(
            str(tar), repository=repo, tag=tag, changes=[f'LABEL {LABEL}="base"']
        )


def _requirements() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"])


def _wheels(log: Log) -> Path:
    """Dependency wheels for the images' Python, downloaded once per dependency set."""
    reqs = _requirements()
    key = hashlib.sha256(json.dumps([reqs, IMAGE_PYTHON, platform.machine()]).encode())
    dest = CACHE_DIR / f"wheels-{key.hexdigest()[:12]}"
    if (dest / ".complete").exists():
        return dest
    log(f"downloading wheels for Python {IMAGE_PYTHON} from PyPI into {dest}")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    arch = platform.machine()
    platforms = [f"manylinux_2_{m}_{arch}" for m in range(36, 16, -1)]
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--dest", str(dest)]
    cmd += ["--only-binary=:all:", "--python-version", IMAGE_PYTHON, "--implementation", "cp"]
    cmd += ["--abi", "cp" + IMAGE_PYTHON.replace(".", "")]
    for p in platforms:
        cmd += ["--platform", p]
    subprocess.run([*cmd, *reqs], check=True, timeout=900)
    (dest / "requirements.txt").write_text("\n".join(reqs) + "\n")
    (dest / ".complete").write_text("")
    return dest


def _source_files() -> list[Path]:
    files = [
        p
        for p in sorted((ROOT / "testbed").rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    ]
    return files


def ensure_images(*, log: Log = log_stderr, force: bool = False) -> str:
    """Build the base and testbed images unless they are current; returns the image tag.

    Cached: the testbed image carries a hash of its Dockerfile, wheels, source and base image;
    when the hash matches, this returns in well under a second.
    """
    client = docker_client()
    base = os.environ.get("TESTBED_BASE_IMAGE", BASE_IMAGE)
    if base == BASE_IMAGE and (force or _image_labels(client, BASE_IMAGE) is None):
        build_base_image(client, log)
    try:
        base_id = client.images.get(base).id
    except Exception:
        raise UserError(f"base image {base} is not available (pull or build it)") from None
    wheels = _wheels(log)
    sources = _source_files()
    digest = hashlib.sha256()
    digest.update((COMPOSE_DIR / "Dockerfile").read_bytes())
    digest.update(base_id.encode())
    for w in sorted(wheels.iterdir()):
        digest.update(w.name.encode())
    digest.update((wheels / "requirements.txt").read_bytes())
    for f in sources:
        digest.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    source_hash = digest.hexdigest()[:16]
    current = f"{IMAGE.split(':')[0]}:src-{source_hash}"
    if not force and _image_labels(client, current) is not None:
        client.images.get(current).tag(IMAGE)
        return IMAGE
    log(f"building {IMAGE} on {base}")
    ctx = CACHE_DIR / "context"
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "src").mkdir(parents=True)
    shutil.copy2(COMPOSE_DIR / "Dockerfile", ctx / "Dockerfile")
    shutil.copytree(wheels, ctx / "wheels", ignore=shutil.ignore_patterns(".complete"))
    for f in sources:
        target = ctx / "src" / f.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    try:
        image, _ = client.images.build(
            path=str(ctx),
            tag=current,
            buildargs={"BASE": base},
            rm=True,
            forcerm=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except Exception as exc:
        log_lines = getattr(exc, "build_log", None) or []
        tail = "".join(str(x.get("stream", x.get("error", ""))) for x in list(log_lines)[-15:])
        raise UserError(f"building {IMAGE} failed: {exc}\n{tail}") from None
    image.tag(IMAGE)
    # Earlier source builds: untag them (their layers below the source stay cached).
    for old in client.images.list(name=IMAGE.split(":")[0]):
        for tag in old.tags:
            if ":src-" in tag and tag != current:
                with contextlib.suppress(Exception):
                    client.images.remove(tag, noprune=False)
    with contextlib.suppress(Exception):  # the previous `latest`, now untagged
        client.images.prune(filters={"dangling": True, "label": f"{LABEL.rsplit('.', 1)[0]}.image"})
    return IMAGE
