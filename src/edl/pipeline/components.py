"""KFP components (KFP SDK 2.17; no `from __future__ import annotations`: KFP reads the real types): lightweight Python components, so that the same definitions run
in ``kfp.local`` (subprocesses on this machine) and on a cluster (in the images of images/).

Each body only imports ``edl`` and calls one function; the work lives in the package
where it is tested without KFP. ``install_kfp_package=False``: the images already hold
the pinned kfp, and a cluster without internet access must not pip-install at start.

``elastic_train``'s signature is the one list of the step's parameters: ``edl.pipeline.params`` reads
it from this file's source (``TRAIN_PARAMETERS``) for ``TrainParams`` (step.py) and the retraining
pipeline's parameters (retrain.py), and this module refuses to load if that reading differs from
what KFP sees.
"""


from kfp import dsl
from kfp.dsl import HTML, Artifact, ClassificationMetrics, Dataset, Input, Metrics, Model, Output

from edl.api.images import DEFAULT_IMAGES
from edl.pipeline.params import TRAIN_PARAMETERS, parameters_of

# The steps' images as compiled by default; ``edl pipeline compile --registry`` sets them per task
# (retrain.py), and each run may too (the pipeline's runtime_image/trainer_image parameters).
RUNTIME_IMAGE = DEFAULT_IMAGES.runtime  # launcher, master, sidecar: no PaddlePaddle
TRAINER_IMAGE = DEFAULT_IMAGES.trainer_cpu  # PaddlePaddle (CPU): data preparation and evaluation need it too


def _component(base_image: str):
    """KFP's component decorator. Where a component runs, KFP's runtime mode (``_KFP_RUNTIME``) has
    none: this module imported there gives the plain functions."""
    if not hasattr(dsl, "component"):
        return lambda func: func
    return dsl.component(base_image=base_image, install_kfp_package=False)


@_component(TRAINER_IMAGE)  # scikit-learn's digits live there
def prepare_data(dataset: Output[Dataset], kind: str = "digits", rows: int = 20000, seed: int = 0):
    """Write a ready-to-train data set (Parquet shards in train/ and test/) into the artifact."""
    from edl.pipeline.tasks import prepare_dataset

    prepare_dataset(kind, dataset.path, rows, seed, dataset.metadata)


@_component(RUNTIME_IMAGE)
def elastic_train(
    model: Output[Model],
    metrics: Output[Metrics],
    summary: Output[Artifact],
    timeline: Output[HTML],
    model_def: str = "edl.zoo.digits",
    epochs: int = 10,
    batch_size: int = 32,
    learning_rate: float = 0.01,
    min_trainers: int = 1,
    max_trainers: int = 4,
    initial_trainers: int = 0,
    trainer_cpu: str = "2",
    trainer_memory: str = "4Gi",
    trainer_gpu: int = 0,
    runtime_image: str = "",
    trainer_image: str = "",
    trainer_gpu_image: str = "",
    trainer_node_selector: str = "",
    trainer_tolerations: str = "",
    scratch_size: str = "1Gi",
    priority_class: str = "",
    checkpoint_uri: str = "",
    s3_secret: str = "",
    warm_start_uri: str = "",
    sidecar_policy: str = "edl",
    sidecar_period_s: float = 10.0,
    sidecar_jitter_s: float = 2.0,
    capacity_slots: int = 0,
    capacity_schedule: str = "",
    job_name: str = "",
    audit: bool = False,
    data_uri: str = "",
    data: Input[Dataset] = None,
    warm_start: Input[Model] = None,
):
    """Elastic data-parallel training of ``model_def`` on ``data`` (a Dataset artifact) or ``data_uri``
    (s3://bucket/prefix, or a directory locally): a master, an autoscale sidecar and
    min..max trainers (pods on a cluster, processes locally); the exported model goes to ``model``
    (its metadata: framework, formats and the ONNX file's URI, data, job and the model it started
    from), the run's timeline to ``timeline`` (an HTML page the KFP UI renders, the plot embedded).

    Re-running the step (KFP retry) adopts the job the first attempt created and resumes from its
    checkpoint in ``checkpoint_uri`` (an s3:// URI on a cluster; credentials from Secret ``s3_secret``).
    ``warm_start`` (an earlier Model artifact: in the pipeline, the parent run's, imported; the
    registry lookup's own, whose ``warm_start.json`` says ``published: false``, when there is none)
    or ``warm_start_uri`` (where one lives) starts from its
    parameters. On a cluster the master and sidecar run in ``runtime_image`` and the trainers in
    ``trainer_image``, or ``trainer_gpu_image`` when ``trainer_gpu`` > 0 (empty: edl's image, of this
    version, for the framework ``model_def`` imports: edl.api.images), on nodes with the labels ``trainer_node_selector`` (KEY=VALUE,...)
    and tolerating ``trainer_tolerations`` (KEY[=VALUE]:EFFECT,...); each pod's /tmp holds
    ``scratch_size`` (data is read from S3, not copied there). ``capacity_slots`` and ``capacity_schedule`` only matter locally
    (kfp.local): trainer slots on the machine and other tenants taking them over time (TIME:SLOTS
    pairs); on a cluster anything but their defaults is an error. ``audit`` counts every record that
    enters the model and reports lost and duplicated samples (its log lives under the checkpoint
    prefix, so it works on a cluster too; one object per trainer step: for tests, not for speed).
    """
    arguments = dict(locals())  # every parameter and artifact above, by name
    from edl.pipeline.step import run_component

    run_component(**arguments)


# What the step and the retraining pipeline derive from (read from this file's source) is what KFP reads:
# the same names, types, defaults and order.
if parameters_of(elastic_train) != TRAIN_PARAMETERS:
    raise TypeError("elastic_train's parameters differ from edl.pipeline.params.TRAIN_PARAMETERS: "
                    f"{[str(p) for p in parameters_of(elastic_train)]} != {[str(p) for p in TRAIN_PARAMETERS]}")


@_component(TRAINER_IMAGE)
def evaluate(model: Input[Model], data: Input[Dataset], metrics: Output[Metrics],
             classification: Output[ClassificationMetrics], model_def: str = "edl.zoo.digits") -> float:
    """Accuracy of ``model`` on the held-out split (test/) of ``data``; also logged as metrics, and the
    confusion matrix (the KFP UI draws it) as classification metrics."""
    from edl.pipeline.step import artifact_uri
    from edl.pipeline.tasks import evaluate_model_in_full

    result, confusion = evaluate_model_in_full(model.path, artifact_uri(data.uri, data.path), model_def)
    for name, value in result.items():
        metrics.log_metric(name, value)
    if confusion is not None:
        classification.log_confusion_matrix([str(c) for c in range(len(confusion))], confusion)
    return float(result["accuracy"])


@_component(RUNTIME_IMAGE)
def beats_published(accuracy: float, registry_uri: str) -> bool:
    """Whether ``accuracy`` beats the model currently published at ``registry_uri`` (or none is)."""
    from edl.pipeline.tasks import beats_published as check

    return check(accuracy, registry_uri)


@_component(RUNTIME_IMAGE)
def publish(model: Input[Model], accuracy: float, registry_uri: str) -> str:
    """Publish ``model`` as the current one at ``registry_uri``; returns where it went."""
    from edl.pipeline.tasks import publish_model

    return publish_model(model.path, accuracy, registry_uri, model.uri)


@_component(RUNTIME_IMAGE)
def deploy(model: Input[Model], registry_uri: str, name: str, job_name: str) -> str:
    """Serve ``model`` with KServe: its ONNX file as a Triton model repository under
    ``registry_uri``/serving/``job_name``, and the InferenceService ``name`` (created, or updated to it)
    in the step's namespace, with the S3 credentials (the step's AWS_* env) wired the way KServe reads
    them. Returns the InferenceService's storage URI."""
    from edl.pipeline.deploy import deploy_model
    from edl.pipeline.step import artifact_uri

    return deploy_model(artifact_uri(model.uri, model.path), registry_uri, name, job_name)
