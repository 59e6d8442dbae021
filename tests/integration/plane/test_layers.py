"""The machine's one unpacked copy of edl's image layers (``images.unpack_layers``), written by
``tools/snapshotter`` with containerd's own code, as the nodes' overlay mounts read it: owners, modes,
times and extended attributes kept, a layer's deletions as overlay whiteouts. No plane: the layers are
made here, in a registry's storage of the test's own."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import tarfile

import pytest

from tests.plane import images
from tests.unit.test_plane_images import registry_storage, tag

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def storage(tmp_path, monkeypatch):
    return registry_storage(tmp_path, monkeypatch)


def layer(members: list[tuple[str, bytes | None, dict]]) -> bytes:
    """A gzipped layer of ``(path, content or None for a directory, TarInfo fields)``, PAX format (for
    extended attributes)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data, fields in members:
            info = tarfile.TarInfo(name)
            info.mtime, info.mode = 1000, 0o755 if data is None else 0o644
            if data is None:
                info.type = tarfile.DIRTYPE
            else:
                info.size = len(data)
            for k, v in fields.items():
                setattr(info, k, v)
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return out.getvalue()


BASE = layer([("etc/", None, {}), ("etc/debian_version", b"12\n", {}), ("cache/", None, {}),
              ("cache/old", b"old", {}), ("gone", b"x", {})])
TOP = layer([(".wh.gone", b"", {}), ("cache/", None, {}), ("cache/.wh..wh..opq", b"", {}),
             ("cache/new", b"new", {}), ("usr/", None, {}), ("usr/bin/", None, {}),
             ("usr/bin/tool", b"#!/bin/sh\n", {"mode": 0o4750, "uid": 10001, "gid": 10002,
                                               "pax_headers": {"SCHILY.xattr.user.edl": "yes"}})])


def test_a_layer_is_unpacked_as_the_overlay_snapshotter_holds_it_and_only_once(storage):
    runtime = tag(storage, "edl-runtime", [BASE, TOP])
    trainer = tag(storage, "edl-trainer-cpu", [BASE, layer([("opt/", None, {}), ("opt/t", b"t", {})])])
    dirs = images.unpack_layers(("runtime", "trainer-cpu"))
    assert [d.name for d in dirs] == [d.replace(":", "-") for d in (*runtime, trainer[1])]  # the base once
    base, top = dirs[0], dirs[1]
    tool = top / "usr/bin/tool"
    st = tool.lstat()
    assert (tool.read_bytes(), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime) == (
        b"#!/bin/sh\n", 0o4750, 10001, 10002, 1000)
    assert os.getxattr(tool, "user.edl") == b"yes"
    gone = (top / "gone").lstat()  # a deletion: a 0/0 character device, as overlayfs marks one
    assert stat.S_ISCHR(gone.st_mode) and os.major(gone.st_rdev) == os.minor(gone.st_rdev) == 0
    assert os.getxattr(top / "cache", "trusted.overlay.opaque") == b"y"  # replaced whole: an opaque directory
    assert not list(top.rglob(".wh.*"))
    os.utime(tool, (5, 5), follow_symlinks=False)  # unpacked already: left as it is
    assert images.unpack_layers(("runtime",)) == dirs[:2] and tool.lstat().st_mtime == 5
    assert not list(images.layers().glob("*.tmp"))
    # What a container of the image sees: the two layers under an overlay mount (in a mount namespace
    # of its own, so nothing stays mounted).
    seen = subprocess.run(
        ["unshare", "--mount", "sh", "-c", 'mkdir -p "$3" && mount -t overlay overlay -o "lowerdir=$1:$2" "$3" '
         '&& cd "$3" && find . -mindepth 1 | sort', "sh", str(top), str(base), str(storage.parent / "merged")],
        capture_output=True, text=True, timeout=30)
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.split() == ["./cache", "./cache/new", "./etc", "./etc/debian_version", "./usr", "./usr/bin",
                                   "./usr/bin/tool"]


def test_a_layer_that_ends_early_is_named_and_leaves_nothing(storage):
    tag(storage, "edl-runtime", [BASE[: len(BASE) // 2]])
    with pytest.raises(images.ImageError, match="unpacking layer sha256:[0-9a-f]+ of edl-runtime failed"):
        images.unpack_layers(("runtime",))
    assert not images.layers().exists() or not list(images.layers().iterdir())
