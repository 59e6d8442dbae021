"""``edl pipeline compile``: every compiled artifact users upload or apply, from the code.

- ``elastic_train.component.yaml``: the component, for ``kfp.components.load_component_from_file``;
- ``retrain.pipeline.yaml``: the KFP pipeline (upload it in the KFP UI, or ``kfp.Client``);
- ``retrain.cronworkflow.yaml``: the Argo CronWorkflow (``kubectl apply -f`` or ``argo cron create``).

The copies committed under components/ and pipelines/ are these files; a test fails when they drift.
"""

from __future__ import annotations

from pathlib import Path

COMPONENT_FILE = "elastic_train.component.yaml"
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


def compile_all(out: Path) -> list[Path]:
    from edl.pipeline.retrain import compile_kfp

    out.mkdir(parents=True, exist_ok=True)
    return [compile_component(out / COMPONENT_FILE), compile_kfp(out / PIPELINE_FILE), compile_argo(out / ARGO_FILE)]
