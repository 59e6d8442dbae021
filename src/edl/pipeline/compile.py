"""``edl pipeline compile``: every compiled artifact users upload or apply, from the code.

- ``elastic_train.component.yaml``: the component, for ``kfp.components.load_component_from_file``;
- ``retrain.pipeline.yaml``: the KFP pipeline (upload it in the KFP UI, or ``kfp.Client``);
- ``retrain.cronworkflow.yaml``: the Argo CronWorkflow (``kubectl apply -f`` or ``argo cron create``);
- ``retrain.cronworkflow.rbac.yaml``: its ServiceAccount, the Role Argo's executor needs and edl's
  launcher Role bound to it (apply with ``edl k8s render``'s 00-rbac.yaml);
- ``autoscale_sidecar.container.yaml`` and ``autoscale_sidecar.rbac.yaml``: the sidecar container the
  launcher puts into every master pod (with the elastic_train defaults), and the RBAC it needs.

Every image is ``REGISTRY/edl-NAME:VERSION`` for the ``images`` given (``--registry``).
The copies committed under components/ and pipelines/ are these files (default registry); a test
fails when they drift.
"""

from __future__ import annotations

from pathlib import Path

from edl.api.images import DEFAULT_IMAGES, Images

COMPONENT_FILE = "elastic_train.component.yaml"
SIDECAR_CONTAINER_FILE = "autoscale_sidecar.container.yaml"
SIDECAR_RBAC_FILE = "autoscale_sidecar.rbac.yaml"
PIPELINE_FILE = "retrain.pipeline.yaml"
ARGO_FILE = "retrain.cronworkflow.yaml"
ARGO_RBAC_FILE = "retrain.cronworkflow.rbac.yaml"


def compile_component(path: Path, images: Images = DEFAULT_IMAGES) -> Path:
    from kfp import compiler, dsl

    from edl.pipeline.components import elastic_train

    path.parent.mkdir(parents=True, exist_ok=True)
    component = elastic_train if images == DEFAULT_IMAGES else dsl.component(
        base_image=images.runtime, install_kfp_package=False)(elastic_train.python_func)
    compiler.Compiler().compile(component, str(path))
    return path


def compile_argo(path: Path, rbac_path: Path, images: Images = DEFAULT_IMAGES) -> list[Path]:
    import yaml

    from edl.pipeline.argo import argo_cron_workflow, argo_rbac

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(argo_cron_workflow(images=images).to_yaml())
    rbac_path.write_text(yaml.safe_dump_all(argo_rbac(), sort_keys=False))
    return [path, rbac_path]


def compile_sidecar(container_path: Path, rbac_path: Path, images: Images = DEFAULT_IMAGES) -> list[Path]:
    """The sidecar as the launcher deploys it, for an example job (placeholders in capitals)."""
    import yaml

    from edl.api.spec import JobSpec, K8sOptions
    from edl.cluster import manifests as m

    spec = JobSpec(job="JOB", model_def="MODEL_DEF", data="s3://DATA", epochs=1, batch_size=1, min_trainers=1,
                   max_trainers=4, trainers=1, checkpoint_uri="s3://CHECKPOINTS")
    opts = K8sOptions(namespace="NAMESPACE", s3_secret="S3_SECRET", image=images.runtime)
    pod = m.master_pod(spec, opts)
    sidecar = next(c for c in pod["spec"]["containers"] if c["name"] == "autoscale-sidecar")
    container_path.write_text(yaml.safe_dump(sidecar, sort_keys=False))
    names = {m.SIDECAR_SA, "edl-sidecar-readonly", f"edl-sidecar-readonly-{opts.namespace}"}
    rbac = [o for o in m.rbac(opts.namespace) if o["metadata"]["name"] in names]
    rbac_path.write_text(yaml.safe_dump_all(rbac, sort_keys=False))
    return [container_path, rbac_path]


def compile_all(out: Path, images: Images = DEFAULT_IMAGES) -> list[Path]:
    from edl.pipeline.retrain import compile_kfp

    out.mkdir(parents=True, exist_ok=True)
    return [compile_component(out / COMPONENT_FILE, images), compile_kfp(out / PIPELINE_FILE, images),
            *compile_argo(out / ARGO_FILE, out / ARGO_RBAC_FILE, images),
            *compile_sidecar(out / SIDECAR_CONTAINER_FILE, out / SIDECAR_RBAC_FILE, images)]
