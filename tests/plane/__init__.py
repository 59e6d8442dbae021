"""A real Kubernetes control plane for the tests and for ``./dev cluster``.

etcd, kube-apiserver, kube-scheduler and kube-controller-manager are the real
binaries, built from their Go modules (``tools/kubeplane``, ``build.py``); only
the kubelet is ours (``kubelet.py``), written against the real API, running the
containers of the pods bound to its node as local processes. ``plane.py``
starts and stops the whole thing; ``s3.py`` a real S3 server beside it.
"""
