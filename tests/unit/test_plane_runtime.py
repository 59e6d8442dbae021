"""The plane's container runtime and image build, the parts that decide without running anything:
which user a container runs as, what a reference names, what an image's build depends on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.plane import images, runtime


def image(tmp_path: Path, user: str = "", passwd: str = "", group: str = "") -> runtime.Image:
    etc = tmp_path / "rootfs" / "etc"
    etc.mkdir(parents=True)
    (etc / "passwd").write_text(passwd or "root:x:0:0:root:/root:/bin/sh\nedl:x:10001:10001::/tmp:/bin/false\n")
    (etc / "group").write_text(group or "root:x:0:\nedl:x:10001:\nstaff:x:50:\n")
    return runtime.Image("sha256:ab", tmp_path / "rootfs", ("edl",), ("--help",), {"PATH": "/usr/local/bin"},
                         user, "/")


@pytest.mark.parametrize("user,pod,container,want", [
    ("10001", {}, {}, (10001, 10001)),  # the image's user, its primary group from /etc/passwd
    ("edl", {}, {}, (10001, 10001)),  # by name
    ("10001:50", {}, {}, (10001, 50)),
    ("edl:staff", {}, {}, (10001, 50)),
    ("", {}, {}, (0, 0)),  # no USER: root
    ("10001", {"runAsUser": 2000}, {}, (2000, 0)),  # the pod's runAsUser, no passwd entry: group 0
    ("10001", {"runAsUser": 2000}, {"runAsUser": 3000, "runAsGroup": 7}, (3000, 7)),  # the container's wins
])
def test_the_container_user_as_a_kubelet_decides_it(tmp_path, user, pod, container, want):
    assert runtime.ids(image(tmp_path, user), pod, container) == want


@pytest.mark.parametrize("user,sc,message", [
    ("", {"runAsNonRoot": True}, "image will run as root"),
    ("edl", {"runAsNonRoot": True}, "non-numeric user (edl)"),
    ("nobody", {}, "unable to find user nobody"),
    ("10001:nogroup", {}, "unable to find group nogroup"),
])
def test_a_user_that_cannot_be_set_up_is_a_config_error(tmp_path, user, sc, message):
    with pytest.raises(runtime.UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        runtime.ids(image(tmp_path, user), {}, sc)


def test_run_as_non_root_passes_with_a_numeric_non_root_user(tmp_path):
    assert runtime.ids(image(tmp_path, "10001"), {"runAsNonRoot": True}, {}) == (10001, 10001)


@pytest.mark.parametrize("ref,host,repo", [
    ("127.0.0.1:5000/edl-runtime:0.1.0", "127.0.0.1:5000", "127.0.0.1:5000/edl-runtime"),
    ("localhost:5000/a/b@sha256:00", "localhost:5000", "localhost:5000/a/b"),
    ("ghcr.io/edl-dev/edl-runtime:0.1.0", "ghcr.io", "ghcr.io/edl-dev/edl-runtime"),
    ("python:3.11", "docker.io", "python"),
    ("library/python", "docker.io", "library/python"),
])
def test_references(ref, host, repo):
    assert runtime.registry_host(ref) == host
    assert runtime.untagged(ref) == repo


def test_only_loopback_registries_are_pulled_from(tmp_path):
    store = runtime.ImageStore(tmp_path / "store")
    with pytest.raises(runtime.PullError, match="registries on loopback only"):
        store.pull("ghcr.io/edl-dev/edl-runtime:0.1.0")
    assert store.present("ghcr.io/edl-dev/edl-runtime:0.1.0") is None


def test_executables_are_found_in_the_image_or_a_volume_never_on_the_host(tmp_path):
    img = image(tmp_path)
    (img.rootfs / "usr" / "local" / "bin").mkdir(parents=True)
    (img.rootfs / "usr" / "local" / "bin" / "edl").symlink_to("/usr/local/bin/python")  # absolute, inside
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / "argoexec").write_bytes(b"")
    (vol / "argoexec").chmod(0o755)
    mounts = [(str(vol), "/var/run/argo", False)]
    assert runtime.find_executable(img, "edl", "/usr/local/bin", mounts)
    assert runtime.find_executable(img, "/usr/local/bin/edl", "", mounts)
    assert runtime.find_executable(img, "/var/run/argo/argoexec", "", mounts)
    assert not runtime.find_executable(img, "sh", "/usr/local/bin", mounts)  # the host has one; the image not
    assert not runtime.find_executable(img, "/bin/sh", "", mounts)


def test_the_image_config_is_read_from_the_oci_layout(tmp_path):
    def put(obj: dict) -> str:
        data = json.dumps(obj).encode()
        import hashlib
        d = hashlib.sha256(data).hexdigest()
        (tmp_path / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (tmp_path / "blobs" / "sha256" / d).write_bytes(data)
        return f"sha256:{d}"

    cfg = put({"config": {"Entrypoint": ["edl"], "User": "10001", "Env": ["PATH=/x"]}})
    man = put({"config": {"digest": cfg}, "layers": []})
    (tmp_path / "index.json").write_text(json.dumps({"manifests": [{"digest": man}]}))
    assert runtime.image_config(tmp_path) == {"Entrypoint": ["edl"], "User": "10001", "Env": ["PATH=/x"]}


def test_the_argv_enters_the_root_filesystem_as_the_user(tmp_path):
    img = image(tmp_path)
    argv = runtime.container_argv(img, tmp_path / "c", "pod-a", [("/host/vol", "/tmp", False)], ["edl", "--help"],
                                  10001, 10001, "/work", read_only=True)
    script = argv[argv.index("-c") + 1]
    assert argv[:5] == [runtime.UNSHARE, "--mount", "--uts", "--propagation", "private"]
    assert argv[-2:] == ["edl", "--help"]
    assert f"lowerdir={img.rootfs}" in script and "mount -o remount,ro" in script
    assert f"mount --bind /host/vol {tmp_path / 'c' / 'root'}/tmp" in script
    assert script.rstrip().endswith('--setuid 10001 --setgid 10001 -- "$@"') and "--wd=/work" in script
    assert (tmp_path / "c" / "upper").is_dir() and (tmp_path / "c" / "root").is_dir()


def test_an_image_is_rebuilt_when_what_it_copies_changes_and_only_then(tmp_path):
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "a.py").write_text("a = 1\n")
    (tmp_path / "src" / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "other.txt").write_text("not copied\n")
    df = tmp_path / "Dockerfile"
    df.write_text("FROM base AS build\nCOPY pyproject.toml ./\nCOPY src ./src\nFROM base\n"
                  "COPY --from=build /install /usr/local\n")
    key = images.image_key(df, tmp_path, "base-1")
    (tmp_path / "other.txt").write_text("changed\n")
    (tmp_path / "src" / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    (tmp_path / "src" / "pkg.egg-info").mkdir()  # an editable install's, as .dockerignore keeps it out
    (tmp_path / "src" / "pkg.egg-info" / "PKG-INFO").write_text("Version: 1\n")
    assert images.image_key(df, tmp_path, "base-1") == key
    assert images.image_key(df, tmp_path, "base-2") != key  # a new base
    (tmp_path / "src" / "pkg" / "a.py").write_text("a = 2\n")
    assert images.image_key(df, tmp_path, "base-1") != key


def test_a_copy_of_a_missing_file_is_named(tmp_path):
    df = tmp_path / "Dockerfile"
    df.write_text("FROM base\nCOPY nothing.txt /x\n")
    with pytest.raises(images.ImageError, match="COPY nothing.txt"):
        images.image_key(df, tmp_path, "b")


def test_the_shipped_cpu_images_share_the_official_python_base():
    assert images.base_reference() == "docker.io/library/python:3.11.11-slim-bookworm"
    assert [s.repo for s in images.shipped_specs()] == ["edl-runtime", "edl-trainer-cpu", "edl-trainer-torch-gpu",
                                                        "edl-storage-initializer"]


def test_mount_targets_resolve_their_symlinks_inside_the_image_never_on_the_host(tmp_path):
    root = tmp_path / "rootfs"
    (root / "run").mkdir(parents=True)
    (root / "var").mkdir()
    (root / "var" / "run").symlink_to("/run")  # as in Debian
    (root / "etc").mkdir()
    (root / "etc" / "alt").symlink_to("../../../../outside")  # climbs: stops at the image's root
    assert runtime.in_root(root, "/var/run/secrets/kubernetes.io/serviceaccount") == \
        "/run/secrets/kubernetes.io/serviceaccount"
    assert runtime.in_root(root, "/etc/alt/x") == "/outside/x"
    assert runtime.in_root(root, "/tmp/../tmp/./a") == "/tmp/a"
    (root / "loop").symlink_to("/loop")
    with pytest.raises(runtime.UserError, match="symbolic links"):
        runtime.in_root(root, "/loop/x")
    img = runtime.Image("sha256:ab", root, (), ("true",), {}, "", "/")
    argv = runtime.container_argv(img, tmp_path / "c", "p", [("/host/sa", "/var/run/secrets/sa", True)], ["true"],
                                  0, 0, "/", read_only=False)
    script = argv[argv.index("-c") + 1]
    assert f"mount --bind /host/sa {tmp_path / 'c' / 'root'}/run/secrets/sa" in script


def test_the_build_context_leaves_out_what_the_image_key_leaves_out():
    ignored = (images.REPO / ".dockerignore").read_text().splitlines()
    assert "**/__pycache__" in ignored and "**/*.egg-info" in ignored
