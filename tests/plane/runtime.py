"""The loopback kubelet's container runtime: images pulled from a registry, unpacked once per
digest, and each container run in its own root filesystem.

- **Pull**: ``skopeo`` resolves the reference to its manifest digest and copies the image by that
  digest into an OCI layout, ``umoci`` unpacks it; the root filesystem and the image's config
  are kept under the build cache by digest and shared by every node and plane (a file lock
  makes the unpack happen once). Only registries on this machine can be reached from here (loopback,
  or a plane's bridge; plain HTTP); any other reference fails to pull.
- **Run**: in new mount and UTS namespaces, an overlay of the image's root filesystem with a
  fresh upper layer per container start, ``/proc``, a minimal ``/dev`` (null, zero, full,
  random, urandom, tty, a private ``/dev/shm``), ``/sys`` read-only, the pod's volumes and its
  ``/etc/hosts`` bind-mounted at their paths; the root made read-only for
  ``readOnlyRootFilesystem``; then ``unshare --root --wd --setuid --setgid`` enters it as the
  image's ``User`` or the pod's ``runAsUser``/``runAsGroup``, in its ``WorkingDir``. Nothing a
  container runs comes from the host's filesystem.

Departures from a container runtime (none of which edl relies on): no PID or network namespace
(processes share the host's process table and network; see ``kubelet.py``), no cgroups (CPU is
not limited; memory is watched by the kubelet), no seccomp profile, capabilities only as a
non-root user has none, no supplementary groups or fsGroup (emptyDir volumes are world-writable
as a kubelet makes them).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = re.compile(r"^(127(\.\d{1,3}){3}|localhost)(:\d+)?$")


def is_local(host: str) -> bool:
    """``HOST[:PORT]`` names an address of this machine (a plane's registry is on its bridge)."""
    import socket

    address = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    try:
        with socket.socket() as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False
PULL_TIMEOUT_S = 900
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # where the set-up finds mount and friends, whatever the image's PATH
UNSHARE = shutil.which("unshare", path=HOST_PATH) or "/usr/bin/unshare"


class PullError(Exception):
    """An image cannot be pulled (ErrImagePull); the message is what the pod's status says."""


class UserError(Exception):
    """The container's user cannot be set up (CreateContainerConfigError)."""


@dataclass(frozen=True)
class Image:
    """An unpacked image: its root filesystem and the parts of its config a container uses."""

    digest: str
    rootfs: Path
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: dict[str, str]
    user: str
    workdir: str


def registry_host(ref: str) -> str:
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def untagged(ref: str) -> str:
    """``ref`` without its tag or digest: the repository to pull a digest from."""
    ref = ref.split("@", 1)[0]
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    return ref[:colon] if colon > slash else ref


class ImageStore:
    """The images of one node, unpacked under ``store`` (shared by every node)."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.store.mkdir(parents=True, exist_ok=True)
        self.pulled: dict[str, Image] = {}  # what this node has pulled, by reference

    def present(self, ref: str) -> Image | None:
        return self.pulled.get(ref)

    def pull(self, ref: str) -> Image:
        host = registry_host(ref)
        if not (LOOPBACK.match(host) or is_local(host)):
            raise PullError(f'failed to pull and unpack image "{ref}": failed to resolve reference "{ref}": '
                            f"{host}: this node reaches registries on loopback only")
        r = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}", f"docker://{ref}"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            detail = (r.stderr.strip().splitlines() or ["not found"])[-1]
            raise PullError(f'failed to pull and unpack image "{ref}": failed to resolve reference "{ref}": '
                            f"{detail[-300:]}")
        image = self._unpacked(ref, r.stdout.strip())
        self.pulled[ref] = image
        return image

    def _unpacked(self, ref: str, digest: str) -> Image:
        name = digest.replace(":", "-")
        final = self.store / name
        with open(self.store / f".{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (final / "image.json").exists():
                self._unpack(ref, digest, final)
        return load(final, digest)

    def _unpack(self, ref: str, digest: str, final: Path) -> None:
        tmp = final.with_name(f".{final.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            layout = tmp / "layout"
            _run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{untagged(ref)}@{digest}",
                  f"oci:{layout}:image"], f"pull {ref}")
            _run(["umoci", "unpack", "--image", f"{layout}:image", str(tmp / "bundle")], f"unpack {ref}")
            config = image_config(layout)
            (tmp / "bundle" / "rootfs").rename(tmp / "rootfs")
            shutil.rmtree(layout)
            shutil.rmtree(tmp / "bundle")
            (tmp / "image.json").write_text(json.dumps(config))
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _run(argv: list[str], what: str) -> None:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=PULL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PullError(f"{what}: took over {PULL_TIMEOUT_S} s") from None
    if r.returncode != 0:
        raise PullError(f"{what}: {(r.stderr.strip().splitlines() or ['failed'])[-1][-300:]}")


def image_config(layout: Path) -> dict:
    """The ``config`` section of the image config in an OCI layout holding one image."""
    def blob(d: str) -> dict:
        algo, _, hexd = d.partition(":")
        return json.loads((layout / "blobs" / algo / hexd).read_bytes())

    index = json.loads((layout / "index.json").read_text())
    manifest = blob(index["manifests"][0]["digest"])
    return blob(manifest["config"]["digest"]).get("config") or {}


def load(d: Path, digest: str) -> Image:
    c = json.loads((d / "image.json").read_text())
    env = dict(e.split("=", 1) for e in c.get("Env") or [] if "=" in e)
    return Image(digest, d / "rootfs", tuple(c.get("Entrypoint") or ()), tuple(c.get("Cmd") or ()), env,
                 c.get("User") or "", c.get("WorkingDir") or "/")


# ---------------------------------------------------------------- users
def _lookup(path: Path, key: str, by_name: bool) -> list[str] | None:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(":")
        if len(fields) >= 3 and (fields[0] if by_name else fields[2]) == key:
            return fields
    return None


def ids(image: Image, pod_sc: dict, sc: dict) -> tuple[int, int]:
    """The container's uid and gid, as a kubelet decides them from the pod, the container and the image."""
    run_as_user = sc.get("runAsUser", pod_sc.get("runAsUser"))
    run_as_group = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
    user, _, group = image.user.partition(":")
    passwd, groups = image.rootfs / "etc" / "passwd", image.rootfs / "etc" / "group"
    uid: int
    if run_as_user is not None:
        uid = int(run_as_user)
    elif not user or user.isdigit():
        uid = int(user or 0)
    else:
        entry = _lookup(passwd, user, by_name=True)
        if entry is None:
            raise UserError(f"unable to find user {user}: no matching entries in passwd file")
        uid = int(entry[2])
    if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
        if run_as_user is None and user and not user.isdigit():
            raise UserError(f"container has runAsNonRoot and image has non-numeric user ({user}), "
                            "cannot verify user is non-root")
        if uid == 0:
            raise UserError("container has runAsNonRoot and image will run as root")
    if run_as_group is not None:
        return uid, int(run_as_group)
    if group:
        if group.isdigit():
            return uid, int(group)
        entry = _lookup(groups, group, by_name=True)
        if entry is None:
            raise UserError(f"unable to find group {group}: no matching entries in group file")
        return uid, int(entry[2])
    entry = _lookup(passwd, str(uid), by_name=False)
    return uid, int(entry[3]) if entry else 0


# ---------------------------------------------------------------- running
def find_executable(image: Image, cmd: str, path: str, mounts: list[tuple[str, str, bool]]) -> bool:
    """Whether the container would find ``cmd``: in one of its volumes (Argo's executor runs a
    binary its init container copied there) or in the image, at an absolute path or on PATH."""
    if cmd.startswith("/"):
        for src, dst, _ in sorted(mounts, key=lambda m: -len(m[1])):
            if cmd.startswith(dst.rstrip("/") + "/"):
                return os.access(src + cmd[len(dst.rstrip("/")):], os.X_OK)
        return os.path.lexists(str(image.rootfs) + cmd)
    return any(os.path.lexists(image.rootfs / d.lstrip("/") / cmd) for d in path.split(":") if d)


def in_root(root: Path, path: str) -> str:
    """``path`` as the container sees it, its symlinks resolved inside ``root``: a mount point under
    ``/var/run`` (a link to ``/run`` in Debian) lands in the container's ``/run``, never the host's,
    as runtimes resolve mount targets (securejoin)."""
    todo = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        here = root.joinpath(*done, part)
        if here.is_symlink():
            links += 1
            if links > 40:
                raise UserError(f"{path}: too many levels of symbolic links in the image")
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            todo = [p for p in target.split("/") if p not in ("", ".")] + todo
            continue
        done.append(part)
    return "/" + "/".join(done)


def container_argv(image: Image, container_dir: Path, hostname: str, mounts: list[tuple[str, str, bool]],
                   argv: list[str], uid: int, gid: int, workdir: str, read_only: bool) -> list[str]:
    """The host command that runs ``argv`` as the container: namespaces, root filesystem, user."""
    upper, work, root = container_dir / "upper", container_dir / "work", container_dir / "root"
    for d in (upper, work):
        shutil.rmtree(d, ignore_errors=True)  # a restarted container starts from its image again
    for d in (upper, work, root):
        d.mkdir(parents=True, exist_ok=True)
    q = shlex.quote
    r = q(str(root))

    def at(path: str) -> str:  # a path in the container's root, quoted for the script
        return r + q(in_root(image.rootfs, path))

    lines = ['_image_path="$PATH"', f"PATH={HOST_PATH}", "set -e", f"hostname {q(hostname)}",
             f"mount -t overlay overlay -o lowerdir={q(str(image.rootfs))},upperdir={q(str(upper))},"
             f"workdir={q(str(work))} {r}",
             f"mkdir -p {at('/proc')} {at('/dev')} {at('/sys')}", f"mount -t proc proc {at('/proc')}",
             f"mount -t tmpfs -o nosuid,mode=755 tmpfs {at('/dev')}",
             *(f"touch {at('/dev')}/{d} && mount --bind /dev/{d} {at('/dev')}/{d}" for d in DEVICES),
             f"mkdir {at('/dev')}/shm && mount -t tmpfs -o nosuid,nodev,mode=1777 shm {at('/dev')}/shm",
             *(f"ln -s /proc/self/fd{n} {at('/dev')}/{name}"
               for n, name in (("", "fd"), ("/0", "stdin"), ("/1", "stdout"), ("/2", "stderr"))),
             f"mount -t sysfs -o ro,nosuid,nodev,noexec sysfs {at('/sys')}"]
    for src, dst, ro in mounts:
        inside = in_root(image.rootfs, dst)
        target = r + q(inside)
        if os.path.isdir(src):
            lines.append(f"mkdir -p {target}")
        else:
            lines.append(f"mkdir -p {r}{q(os.path.dirname(inside))} && touch {target}")
        lines.append(f"mount --bind {q(src)} {target}")
        if ro:
            lines.append(f"mount -o remount,bind,ro {target}")
    if read_only:
        lines.append(f"mount -o remount,ro {r}")
    # The image's PATH again: the command is looked up inside the new root.
    lines.append(f'PATH="$_image_path" exec {UNSHARE} --root={r} --wd={q(workdir)} --setuid {uid} --setgid {gid} -- "$@"')
    return [UNSHARE, "--mount", "--uts", "--propagation", "private", "/bin/sh", "-c", "\n".join(lines), "sh", *argv]
