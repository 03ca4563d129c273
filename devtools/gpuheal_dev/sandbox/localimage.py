"""Tiny container images written from files of this host, for the sandbox's real node.

No registry is reachable here, so nothing can be pulled: the real node's pause image and the
test images are docker-archive tars (the format ``docker save`` writes and
``ctr images import`` reads) of one layer holding Debian's static busybox.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
PAUSE_IMAGE = "gpuheal.local/pause:1"
BUSYBOX_IMAGE = "gpuheal.local/busybox:1"


def write_image_tar(
    out: Path,
    ref: str,
    files: Mapping[str, Path],
    *,
    entrypoint: Sequence[str],
    user: str = "",
) -> Path:
    """Write a one-layer docker-archive image ``ref`` holding ``files`` (path in the image ->
    file on this host, copied with its mode) to ``out``. The same inputs give the same bytes."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(p) for f in files for p in Path(f.lstrip("/")).parents} - {"."})
        for d in [*dirs, "tmp"]:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for dest, src in sorted(files.items()):
            info = tarfile.TarInfo(dest.lstrip("/"))
            data = src.read_bytes()
            info.size = len(data)
            info.mode = src.stat().st_mode & 0o7777
            tar.addfile(info, io.BytesIO(data))
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": list(entrypoint), "User": user, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "gpuheal_dev.sandbox.localimage"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": [layer_name]}]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tarfile.open(tmp, mode="w") as tar:
        for name, data in (
            (config_name, config_bytes),
            (layer_name, layer_bytes),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    return out


def busybox_image(out: Path, ref: str = BUSYBOX_IMAGE, *, user: str = "") -> Path:
    """Debian's static busybox as /bin/busybox and /bin/sh; the entrypoint is busybox itself, so
    a pod names the applet (``command: [/bin/sh, -c, ...]``)."""
    _need_busybox()
    return write_image_tar(
        out,
        ref,
        {"/bin/busybox": BUSYBOX, "/bin/sh": BUSYBOX},
        entrypoint=["/bin/busybox"],
        user=user,
    )


def pause_image(out: Path, ref: str = PAUSE_IMAGE) -> Path:
    """The pod sandbox image: it only has to hold the pod's namespaces open. busybox's sleep as
    PID 1 ignores SIGTERM, which is fine: containerd stops a sandbox with SIGKILL."""
    _need_busybox()
    return write_image_tar(
        out,
        ref,
        {"/bin/busybox": BUSYBOX},
        entrypoint=["/bin/busybox", "sleep", "2147483647"],
        user="65535",
    )


def _need_busybox() -> None:
    if not BUSYBOX.exists():
        raise FileNotFoundError(
            f"{BUSYBOX} is missing: `make realnode-deps` installs Debian's busybox-static"
        )
