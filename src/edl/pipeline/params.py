"""The elastic-train step's parameters: the one list, without KFP.

``TRAIN_PARAMETERS`` (their names, types and defaults, in order) is what ``TrainParams`` (step.py)
and the retraining pipeline's parameters (retrain.py) derive from. The component
(``components.elastic_train``) writes the same parameters out in its signature, because KFP reads
the signature and runs the function's source in the image; components.py refuses to load if the
two differ. This module imports neither KFP nor the component, so the step that the component
runs (step.py) reads its parameters here without importing the component back.

No ``from __future__ import annotations``: the types are read as types (KFP's parameters).
"""

import inspect


def _elastic_train_parameters(
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
):
    """The parameters (not the artifacts) of ``components.elastic_train``; what they mean is its docstring."""


# The parameters, in their order, with their types and defaults.
TRAIN_PARAMETERS: tuple[inspect.Parameter, ...] = tuple(inspect.signature(_elastic_train_parameters).parameters.values())
TRAIN_DEFAULTS: dict = {p.name: p.default for p in TRAIN_PARAMETERS}


def parameters_of(func) -> tuple[inspect.Parameter, ...]:
    """The parameters (not the artifacts) of a component's function (of the function a component
    wraps, or of the plain function in KFP's runtime mode), in their order."""
    return tuple(p for p in inspect.signature(getattr(func, "python_func", func)).parameters.values()
                 if p.annotation in (str, int, float, bool))
