"""The Kubernetes API edge's transport against a loopback server that accepts and never answers
(an apiserver just restarted behind a Service, a half-open connection): one request is one
connection bounded by its timeout; retrying is ``KubeApi``'s, not urllib3's."""

from __future__ import annotations

import socket
import threading

import pytest

from edl.cluster import kube_api
from edl.cluster.kube_api import KubeApi, load_api_client
from edl.errors import KubeUnavailableError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def silent_server():
    """A listening loopback socket that accepts connections, reads nothing and answers nothing."""
    srv = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(srv.accept()[0])
            except TimeoutError:
                continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], accepted
    stop.set()
    t.join(5)
    for c in accepted:
        c.close()
    srv.close()


def test_a_request_that_gets_no_answer_is_tried_once_and_ends_at_its_read_timeout(silent_server, tmp_path,
                                                                                  monkeypatch, caplog):
    port, accepted = silent_server
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    monkeypatch.setattr(kube_api, "REQUEST_TIMEOUT_S", (1.0, 0.3))
    kube = KubeApi(load_api_client(str(kubeconfig)), "ml", give_up_s=0.0)
    with pytest.raises(KubeUnavailableError, match="unreachable: read pods 'p': .*Read timed out"):
        kube.get("pods", "p")
    assert len(accepted) == 1  # urllib3's default would have tried three times more
    assert not [r for r in caplog.records if r.name.startswith("urllib3")]
