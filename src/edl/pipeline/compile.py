"""``edl pipeline compile``: every compiled artifact users upload or apply, from the code.

- ``elastic_train.component.yaml``: the component, for ``kfp.components.load_component_from_file``;
- ``retrain.pipeline.yaml``: the KFP pipeline (upload it in the KFP UI, or ``kfp.Client``);
- ``retrain.cronworkflow.yaml``: the Argo CronWorkflow (``kubectl apply -f`` or ``argo cron create``);
- ``autoscale_sidecar.container.yaml`` and ``autoscale_sidecar.rbac.yaml``: the sidecar container the
  launcher puts into every master pod (with the elastic_train defaults), and the RBAC it needs.

The copies committed under components/ and pipelines/ are these files; a test fails when they drift.
"""

from __future__ import annotations

from pathlib import Path

COMPONENT_FILE = "elastic_train.component.yaml"
SIDECAR_CONTAINER_FILE = "autoscale_sidecar.container.yaml"
SIDECAR_RBAC_FILE = "autoscale_sidecar.rbac.yaml"
PIPELINE_FILE = "retrain.pipeline.yaml"
ARGO_FILE = "retrain.cronworkflow.yaml"


def compile_component(path: Path) -> Path:
    from kfp import compiler

    from edl.pipeline.components import elastic_train

    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(elastic_train, str(path))
    return path


def compile_argo(path: Path) -> Path:
    from edl.pipeline.retrain import argo_cron_workflow

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(argo_cron_workflow().to_yaml())
    return path


def compile_sidecar(container_path: Path, rbac_path: Path) -> list[Path]:
    """The sidecar as the launcher deploys it, for an example job (placeholders in capitals)."""
    import yaml

    from edl.api.spec import JobSpec, K8sOptions
    from edl.cluster import manifests as m

    spec = JobSpec(job="JOB", model_def="MODEL_DEF", data="s3://DATA", epochs=1, batch_size=1, min_trainers=1,
                   max_trainers=4, trainers=1, checkpoint_uri="s3://CHECKPOINTS")
    opts = K8sOptions(namespace="NAMESPACE", s3_secret="S3_SECRET")
    pod = m.master_pod(spec, opts)
    sidecar = next(c for c in pod["spec"]["containers"] if c["name"] == "autoscale-sidecar")
    container_path.write_text(yaml.safe_dump(sidecar, sort_keys=False))
    names = {m.SIDECAR_SA, "edl-sidecar-readonly", f"edl-sidecar-readonly-{opts.namespace}"}
    rbac = [o for o in m.rbac(opts.namespace) if o["metadata"]["name"] in names]
    rbac_path.write_text(yaml.safe_dump_all(rbac, sort_keys=False))
    return [container_path, rbac_path]


def compile_all(out: Path) -> list[Path]:
    from edl.pipeline.retrain import compile_kfp

    out.mkdir(parents=True, exist_ok=True)
    return [compile_component(out / COMPONENT_FILE), compile_kfp(out / PIPELINE_FILE), compile_argo(out / ARGO_FILE),
            *compile_sidecar(out / SIDECAR_CONTAINER_FILE, out / SIDECAR_RBAC_FILE)]
