"""``edl pipeline compile``: every compiled artifact users upload or apply, from the code.

- ``elastic_train.component.yaml``: the component, for ``kfp.components.load_component_from_file``;
- ``retrain.pipeline.yaml``: the KFP pipeline (upload it in the KFP UI, or ``kfp.Client``);
- ``retrain.cronworkflow.yaml``: the Argo CronWorkflow (``kubectl apply -f`` or ``argo cron create``);
- ``retrain.cronworkflow.rbac.yaml``: its ServiceAccount, the Role Argo's executor needs and edl's
  launcher Role bound to it (apply with ``edl k8s render``'s 00-rbac.yaml).

Every image is ``REGISTRY/edl-NAME:VERSION`` for the ``images`` given (``--registry``).
The copies committed under components/ and pipelines/ are these files (default registry); a test
fails when they drift.
"""

from __future__ import annotations

from pathlib import Path

from edl.api.images import DEFAULT_IMAGES, Images

COMPONENT_FILE = "elastic_train.component.yaml"
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


def compile_all(out: Path, images: Images = DEFAULT_IMAGES) -> list[Path]:
    from edl.pipeline.retrain import compile_kfp

    out.mkdir(parents=True, exist_ok=True)
    return [compile_component(out / COMPONENT_FILE, images), compile_kfp(out / PIPELINE_FILE, images),
            *compile_argo(out / ARGO_FILE, out / ARGO_RBAC_FILE, images)]
