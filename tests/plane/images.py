"""The images the plane runs: ours, built from ``images/*/Dockerfile`` as a user would build them,
and Argo's executor, pushed to a registry whose storage lives in the build cache.

    python -m tests.plane.images      # build what is missing, with progress; a no-op when cached

- **The base.** The Dockerfiles start ``FROM python:3.11.11-slim-bookworm``, which no registry
  here serves. Its look-alike is made from Debian's packages: ``mmdebstrap`` of bookworm
  (minbase, ``python3.11``, ``python3-venv``, ``ca-certificates``) with a venv at ``/usr/local``
  as the official image has its Python there, the official image's PATH and LANG, committed by
  ``buildah`` under the official name, so the Dockerfiles build unchanged. Cached as a tarball
  keyed by what makes it.
- **Ours.** ``buildah bud`` (chroot isolation, no daemon) of every CPU image, the host's CA
  bundle mounted read-only for the RUN steps' downloads. Each image carries the label
  ``edl.cache.key``: the hash of its Dockerfile, the files its COPY lines name and the base's
  ID. An image whose key the registry already holds is not built again.
  ``images/trainer-gpu`` is not built: its base (PaddlePaddle's CUDA image) cannot be had here;
  nor ``images/trainer-torch-cpu``: PyTorch's own index (its CPU wheel) cannot be reached. The
  PyTorch trainers on the plane run ``edl-trainer-torch-gpu`` (PyPI's CUDA build), which trains
  on CPUs with Gloo as well.
- **Argo's executor**: ``argoexec`` (built from Argo's module, ``build.py``) alone in an image
  from scratch (``tools/argo/Containerfile``), as Argo ships it.

- **The pod sandbox** of the real nodes: ``tools/pause/pause.c`` compiled static with gcc, alone in
  an image from scratch (``tools/pause/Containerfile``), as ``edl-pause:1.0``.

What the registry holds: ``edl-runtime:VERSION``, ``edl-trainer-cpu:VERSION``,
``edl-trainer-torch-gpu:VERSION`` (VERSION as
``edl pipeline compile`` tags them), ``edl-pause:1.0`` and ``argoproj/argoexec:ARGO_VERSION``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.plane import build
from tests.plane.procs import machine_lock
from tests.plane.registry import Registry, RegistryError, garbage_collect

REPO = build.REPO
ARGO_VERSION = "v4.0.5"
ARGOEXEC_REPO = "argoproj/argoexec"
KEY_LABEL = "edl.cache.key"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# Not built: trainer-gpu (its base, PaddlePaddle's CUDA image, cannot be had here) and
# trainer-torch-cpu (PyTorch's CPU index cannot be reached). trainer-torch-gpu runs on CPUs too.
SHIPPED = ("runtime", "trainer-cpu", "trainer-torch-gpu", "storage-initializer")
TOOLS = ("buildah", "skopeo", "mmdebstrap", "docker-registry")

# The look-alike of the official python:3.11 slim image.
BASE_SUITE = "bookworm"
BASE_SOURCES = ("deb http://deb.debian.org/debian bookworm main",
                "deb http://deb.debian.org/debian bookworm-updates main",
                "deb http://deb.debian.org/debian-security bookworm-security main")
BASE_PACKAGES = ("python3.11", "python3-venv", "ca-certificates")
BASE_HOOK = 'chroot "$1" python3.11 -m venv /usr/local'
BASE_ENV = ("PATH=/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
            "PYTHON_VERSION=3.11")


class ImageError(RuntimeError):
    pass


def version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def cache() -> Path:
    return build.cache_root() / "images"


def storage() -> Path:
    """The registry's storage: what every plane's registry serves."""
    return cache() / "registry"


def layers() -> Path:
    """The machine's one unpacked copy of the images' layers, a directory per layer digest: what the
    real nodes' snapshotters take edl's layers from (``tools/snapshotter``)."""
    return cache() / "overlay-layers"


def layer_dir(digest: str) -> Path:
    """The machine's copy of the layer ``digest`` (``sha256:HEX`` -> ``layers()/sha256-HEX``: the name
    ``tools/snapshotter`` looks for)."""
    return layers() / digest.replace(":", "-", 1)


# What an earlier edl unpacked and nothing reads now: the emulated kubelets' root filesystems, and the
# layers unpacked with tar that nodes hard-linked their own pulled files to.
OLD_UNPACKED = ("unpacked", "layers")


def _blob(digest: str) -> Path:
    """A blob in the registry's storage (the Distribution server's filesystem layout)."""
    algorithm, hexdigest = digest.split(":", 1)
    return storage() / "docker/registry/v2/blobs" / algorithm / hexdigest[:2] / hexdigest / "data"


def layer_digests(repo: str, tag: str) -> list[str]:
    """The layers of ``repo:tag`` as the registry's storage holds it, the base first."""
    link = storage() / "docker/registry/v2/repositories" / repo / "_manifests/tags" / tag / "current/link"
    try:
        manifest = json.loads(_blob(link.read_text().strip()).read_bytes())
        return [layer["digest"] for layer in manifest["layers"]]
    except (OSError, ValueError, KeyError) as e:
        raise ImageError(f"{repo}:{tag} is not in the registry's storage ({e})") from None


def unpacked(name: str) -> bool:
    """Every layer of edl's image ``name`` is in the machine's copy already."""
    return all(layer_dir(d).is_dir() for d in layer_digests(f"edl-{name}", version()))


def unpack_layers(names: tuple[str, ...], timeout_s: float = 1800) -> list[Path]:
    """Each layer of edl's images ``names`` unpacked once into ``layers()`` as containerd's overlay
    snapshotter holds it (owners, modes, times and extended attributes kept, whiteouts as overlay
    whiteouts: ``tools/snapshotter``'s ``unpack``, with containerd's own code); returns their
    directories. The first time a minute or two an image, then nothing."""
    out: list[Path] = []
    with machine_lock(cache() / ".layers.lock", timeout_s, "another unpacking of the images' layers"):
        for name in names:
            for digest in layer_digests(f"edl-{name}", version()):
                d = layer_dir(digest)
                if not d.exists():
                    tmp = d.with_name(d.name + ".tmp")
                    shutil.rmtree(tmp, ignore_errors=True)
                    tmp.mkdir(parents=True)
                    try:
                        _run([str(build.SNAPSHOTTER.path()), "unpack", str(_blob(digest)), str(tmp)],
                             f"unpacking layer {digest} of edl-{name}", timeout_s)
                    except ImageError:
                        shutil.rmtree(tmp, ignore_errors=True)
                        raise
                    tmp.rename(d)
                if d not in out:
                    out.append(d)
    return out


def dockerfile(name: str) -> Path:
    return REPO / "images" / name / "Dockerfile"


def base_reference() -> str:
    """The image the Dockerfiles start from, fully qualified as buildah names it."""
    refs: set[str] = set()
    for n in SHIPPED:
        text = dockerfile(n).read_text()
        stages = set(re.findall(r"^FROM \S+ AS (\S+)", text, re.M | re.I))
        refs |= {m for m in re.findall(r"^FROM (\S+)", text, re.M) if not m.startswith("$") and m not in stages}
    if len(refs) != 1:
        raise ImageError(f"the CPU images must share one base, they name {sorted(refs)}")
    ref = refs.pop()
    return ref if "/" in ref.split(":")[0] else f"docker.io/library/{ref}"


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()[:16]


def base_key() -> str:
    return _digest(BASE_SUITE.encode(), *(s.encode() for s in BASE_SOURCES + BASE_PACKAGES + BASE_ENV),
                   BASE_HOOK.encode())


def context_files(path: Path, context: Path) -> list[Path]:
    """The files the Dockerfile's COPY/ADD lines take from the context (not from another stage), less
    what ``.dockerignore`` keeps out of it: bytecode and the egg-info an editable install leaves in
    ``src/`` (its PKG-INFO holds the README as it was at install time)."""
    out: list[Path] = []
    for line in path.read_text().splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD") or any(w.startswith("--from") for w in words):
            continue
        for src in (w for w in words[1:-1] if not w.startswith("--")):
            p = context / src
            if p.is_dir():
                out += sorted(f for f in p.rglob("*") if f.is_file() and not any(
                    part == "__pycache__" or part.endswith(".egg-info") for part in f.parts))
            elif p.is_file():
                out.append(p)
            else:
                raise ImageError(f"{path}: COPY {src}: no such file in {context}")
    return out


def image_key(path: Path, context: Path, base_id: str) -> str:
    parts = [path.read_bytes(), base_id.encode()]
    for f in context_files(path, context):
        parts += [str(f.relative_to(context)).encode(), f.read_bytes()]
    return _digest(*parts)


@dataclass(frozen=True)
class Spec:
    """One image to build: ``repo:tag`` in the registry, from ``containerfile`` over ``context``."""

    repo: str
    tag: str
    containerfile: Path
    context: Path

    @property
    def local(self) -> str:
        return f"localhost/{self.repo}:{self.tag}"


def shipped_specs() -> list[Spec]:
    return [Spec(f"edl-{name}", version(), dockerfile(name), REPO) for name in SHIPPED]


def argoexec_spec() -> Spec:
    return Spec(ARGOEXEC_REPO, ARGO_VERSION, build.TOOLS / "argo" / "Containerfile", build.ARGOEXEC.out_dir())


PAUSE_REPO, PAUSE_TAG = "edl-pause", "1.0"
PAUSE_SOURCE = build.TOOLS / "pause" / "pause.c"


def pause_spec() -> Spec:
    """The real nodes' sandbox image: ``tools/pause/pause.c`` built static, alone in an image."""
    return Spec(PAUSE_REPO, PAUSE_TAG, build.TOOLS / "pause" / "Containerfile", cache() / "pause")


def pause_reference(registry: str) -> str:
    return f"{registry}/{PAUSE_REPO}:{PAUSE_TAG}"


def compile_pause(context: Path) -> None:
    """``pause`` into the image's build context (a static binary: the image has nothing else)."""
    context.mkdir(parents=True, exist_ok=True)
    tmp = context / ".pause.tmp"
    _run(["gcc", "-static", "-Os", "-Wall", "-Wextra", "-Werror", "-o", str(tmp), str(PAUSE_SOURCE)],
         "gcc -static pause.c")
    tmp.rename(context / "pause")


def reference(registry: str, name: str) -> str:
    """``REGISTRY/edl-NAME:VERSION`` for one of ours (``runtime``, ``trainer-cpu``)."""
    return f"{registry}/edl-{name}:{version()}"


def argoexec_reference(registry: str) -> str:
    return f"{registry}/{ARGOEXEC_REPO}:{ARGO_VERSION}"


# ---------------------------------------------------------------- tools
def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def _run(argv: list[str], what: str, timeout: float = 1800, **kw) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)
    except subprocess.TimeoutExpired:
        raise ImageError(f"{what}: took over {timeout:.0f} s") from None
    if r.returncode != 0:
        raise ImageError(f"{what} failed ({r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
    return r.stdout


def local_labels(ref: str) -> dict[str, str] | None:
    """The labels of an image in buildah's storage, ``None`` if it has none of that name."""
    r = subprocess.run(["buildah", "inspect", "--type", "image", ref], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    info = json.loads(r.stdout)
    return dict((info.get("OCIv1", {}).get("config") or {}).get("Labels") or {}) | {"@id": info["FromImageID"]}


def pushed_key(registry: str, spec: Spec) -> str | None:
    """The cache key of the image the registry holds under ``spec``'s name, ``None`` if none."""
    r = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--config",
                        f"docker://{registry}/{spec.repo}:{spec.tag}"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return None
    return ((json.loads(r.stdout).get("config") or {}).get("Labels") or {}).get(KEY_LABEL)


# ---------------------------------------------------------------- building
class Steps:
    """Progress of the image builds: one line per image, the current Dockerfile step beside it."""

    def __init__(self, quiet: bool) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        # On stderr: ``./dev cluster up`` prints only its export lines on stdout, for eval.
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                 console=Console(stderr=True), disable=quiet)

    def __enter__(self) -> "Steps":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[object]:
        """A line for ``what``; one that had nothing to do (done within a second) is dropped."""
        task = self.progress.add_task(what, total=None)
        t0 = time.monotonic()
        yield lambda detail: self.progress.update(task, description=f"{what}: {detail}"[:110])
        took = time.monotonic() - t0
        if took < 1:
            self.progress.remove_task(task)
        else:
            self.progress.update(task, description=f"{what}: done in {took:.0f} s", total=1, completed=1)


def ensure_base(steps: Steps) -> str:
    """The base image in buildah's storage, made if missing; returns its image ID."""
    ref, key = base_reference(), base_key()
    labels = local_labels(ref)
    if labels and labels.get(KEY_LABEL) == key:
        return labels["@id"]
    tar = cache() / f"base-{key}.tar"
    with steps.step(f"base image {ref} (Debian {BASE_SUITE}, first time about 2 minutes)") as note:
        if not tar.exists():
            note("mmdebstrap")
            tmp = tar.with_suffix(".tmp.tar")
            tmp.unlink(missing_ok=True)
            _run(["mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                  f"--customize-hook={BASE_HOOK}", BASE_SUITE, str(tmp), *BASE_SOURCES], "mmdebstrap")
            tmp.rename(tar)
        note("buildah commit")
        ctr = _run(["buildah", "from", "scratch"], "buildah from scratch").strip()
        try:
            _run(["buildah", "add", "--quiet", ctr, str(tar), "/"], "buildah add")
            _run(["buildah", "config", *(a for e in BASE_ENV for a in ("--env", e)), "--cmd", "python3",
                  "--label", f"{KEY_LABEL}={key}", ctr], "buildah config")
            _run(["buildah", "commit", "--quiet", ctr, ref], "buildah commit")
        finally:
            subprocess.run(["buildah", "rm", ctr], capture_output=True)
    labels = local_labels(ref)
    assert labels is not None
    return labels["@id"]


def deps_reference(spec: Spec) -> str:
    """Where buildah keeps the dependencies' stage of ``spec`` between builds."""
    return f"{spec.local.rsplit(':', 1)[0]}-deps:cache"


def build_one(spec: Spec, key: str, steps: Steps) -> None:
    """``buildah bud`` of ``spec`` into buildah's storage, labelled with ``key``."""
    # --force-rm: a failed build leaves no working container (each holds a copy of what its step wrote,
    # GBs for the CUDA builds: a few failures on a full disk filled it).
    bud = ["buildah", "bud", "--isolation", "chroot", "--pull-never", "--layers", "--force-rm",
           "-f", str(spec.containerfile)]
    if HOST_CA.exists():  # the RUN steps' downloads go through this machine's CA
        bud += ["-v", f"{HOST_CA}:{HOST_CA}:ro"]
    argv = [*bud, "-t", spec.local, "--label", f"{KEY_LABEL}={key}", str(spec.context)]
    # The image this build replaces goes first: its copy of the dependencies (GBs for the CUDA builds) would
    # otherwise sit beside the new one's until ``prune``, and fill a small disk. The layers that make the
    # build fast stay, under the dependencies' stage's own tag.
    subprocess.run(["buildah", "rmi", spec.local], capture_output=True)
    tail: list[str] = []
    with steps.step(f"image {spec.repo}:{spec.tag}") as note:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL)
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-40:]
            if "STEP " in line:
                note(line.strip())
        if proc.wait() != 0:
            raise ImageError(f"buildah bud {spec.containerfile} failed:\n" + "\n".join(tail))
        if re.search(r"^FROM \S+ AS deps$", spec.containerfile.read_text(), re.M | re.I):
            # The dependencies' stage, from the layers just built, under a name of its own: ``prune``
            # keeps it, so the next change to src/ rebuilds only edl's small layer.
            _run([*bud, "--target", "deps", "-t", deps_reference(spec), str(spec.context)],
                 f"buildah bud --target deps {spec.containerfile}")


def push(spec: Spec, registry: str) -> None:
    _run(["buildah", "push", "--quiet", "--tls-verify=false", spec.local,
          f"docker://{registry}/{spec.repo}:{spec.tag}"], f"buildah push {spec.repo}")


def _locked() -> contextlib.AbstractContextManager[None]:
    """One builder at a time (two test workers may both find the images missing)."""
    return machine_lock(cache() / ".lock")


def build_images(*, quiet: bool = False) -> None:
    """Every image the plane runs in the registry's storage, built where missing or stale."""
    missing = missing_tools()
    if missing:
        raise ImageError(f"{', '.join(missing)} not installed (Debian packages; ./dev installs them as root)")
    with _locked(), Steps(quiet) as steps:
        with Registry(storage(), cache() / "logs", read_only=False) as reg:
            specs = [*shipped_specs(), pause_spec()]
            if build.ARGOEXEC.built():
                specs.append(argoexec_spec())
            base_id = ""
            pushed = False
            for spec in specs:
                if spec.repo == ARGOEXEC_REPO:
                    key = _digest(spec.containerfile.read_bytes(), build.ARGOEXEC.key().encode())
                elif spec.repo == PAUSE_REPO:
                    key = _digest(spec.containerfile.read_bytes(), PAUSE_SOURCE.read_bytes())
                else:
                    base_id = base_id or ensure_base(steps)
                    key = image_key(spec.containerfile, spec.context, base_id)
                if pushed_key(reg.host, spec) == key:
                    continue
                labels = local_labels(spec.local)
                if not labels or labels.get(KEY_LABEL) != key:
                    if spec.repo == PAUSE_REPO:
                        compile_pause(spec.context)
                    build_one(spec, key, steps)
                push(spec, reg.host)
                pushed = True
        if pushed or any((cache() / old).exists() for old in OLD_UNPACKED):
            prune({d for s in specs for d in layer_digests(s.repo, s.tag)})


def prune(keep: set[str]) -> None:
    """What the builds left behind: images no tag names any more, in buildah's storage and the
    registry's storage, and the unpacked layers no image has any more (a run after a change to
    ``src/`` would otherwise add a few GB each time)."""
    subprocess.run(["buildah", "rmi", "--prune"], capture_output=True)
    for old in OLD_UNPACKED:
        shutil.rmtree(cache() / old, ignore_errors=True)
    if layers().exists():
        for d in layers().iterdir():
            if d.name.removesuffix(".tmp").replace("-", ":", 1) not in keep:
                shutil.rmtree(d, ignore_errors=True)
    garbage_collect(storage(), cache() / "logs")


def main() -> int:
    # Stopped (./dev test interrupted, a CI timeout): unwind, so the writable registry stops with us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.monotonic()
    try:
        build_images()
    except (ImageError, RegistryError) as e:
        print(f"edl plane images: {e}", file=sys.stderr)
        return 1
    print(f"images: {storage()} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    raise SystemExit(main())
