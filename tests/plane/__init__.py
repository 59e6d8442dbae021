"""A real Kubernetes cluster on this machine, for the tests and for ``./dev cluster``.

etcd, kube-apiserver, kube-scheduler and kube-controller-manager are the real binaries, built from
their Go modules (``tools/kubeplane``, ``build.py``); each node is the upstream kubelet with
containerd, runc, the CNI bridge and kube-proxy in a network namespace of its own (``node.py``,
``network.py``), with CoreDNS for the cluster. ``plane.py`` starts and stops the whole thing;
``images.py`` builds edl's images into its registry and unpacks their layers once for every node
(``tools/snapshotter``); ``s3.py`` runs a real S3 server beside it.
"""
