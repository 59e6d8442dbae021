"""The job options shared by ``edl train``, ``edl master`` (and later ``edl k8s render``)."""

from __future__ import annotations

import argparse

from edl.master.job import JobSpec


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("job")
    g.add_argument("--job-name", required=True, help="name of the job; also names its state directory and objects")
    g.add_argument("--model-def", required=True,
                   help="module path (edl.zoo.digits) or .py file defining model/loss/optimizer/collate")
    g.add_argument("--data", required=True,
                   help="training data: a directory or s3:// prefix of Parquet files with an integer 'id' column "
                        "(or a prepared set with train/ and test/ below it)")
    g.add_argument("--eval-data", default=None,
                   help="held-out data for the final metrics (default: DATA/test when DATA has one)")
    g.add_argument("--epochs", type=int, required=True, help="passes over the training data")
    g.add_argument("--batch-size", type=int, required=True, help="records per trainer per step")
    g.add_argument("--learning-rate", type=float, default=0.01, help="passed to the model's optimizer() (default 0.01)")
    g.add_argument("--min-trainers", type=int, default=1, help="never scale below this (default 1)")
    g.add_argument("--max-trainers", type=int, default=4, help="never scale above this (default 4)")
    g.add_argument("--trainers", type=int, default=None, help="initial desired trainer count (default: --min-trainers)")
    g.add_argument("--checkpoint-uri", required=True,
                   help="file:///dir, a path, or s3://bucket/prefix (S3 endpoint and keys from AWS_ENDPOINT_URL, "
                        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")
    g.add_argument("--checkpoint-interval", type=float, default=30.0, help="seconds between checkpoints (default 30)")
    g.add_argument("--keep-checkpoints", type=int, default=3, help="committed checkpoints to keep (default 3)")
    g.add_argument("--rows-per-task", type=int, default=0, help="rows per data task (default: 4 x batch size)")
    g.add_argument("--max-task-failures", type=int, default=3,
                   help="fail the job when one data task fails more often than this (default 3)")
    g.add_argument("--seed", type=int, default=0, help="seed for model initialisation and task order (default 0)")
    g.add_argument("--audit", action="store_true",
                   help="log every record id that enters the model and report lost/duplicate samples")


def spec_from_args(a: argparse.Namespace) -> JobSpec:
    spec = JobSpec(
        job=a.job_name,
        model_def=a.model_def,
        data=a.data,
        eval_data=a.eval_data,
        epochs=a.epochs,
        batch_size=a.batch_size,
        learning_rate=a.learning_rate,
        min_trainers=a.min_trainers,
        max_trainers=a.max_trainers,
        trainers=a.trainers if a.trainers is not None else a.min_trainers,
        checkpoint_uri=a.checkpoint_uri,
        checkpoint_interval_s=a.checkpoint_interval,
        keep_checkpoints=a.keep_checkpoints,
        rows_per_task=a.rows_per_task,
        max_task_failures=a.max_task_failures,
        seed=a.seed,
        audit=a.audit,
    )
    spec.validate()
    return spec


def spec_to_argv(spec: JobSpec) -> list[str]:
    """The same spec as command-line flags (for spawning ``edl master``)."""
    argv = [
        "--job-name", spec.job, "--model-def", spec.model_def, "--data", spec.data,
        "--epochs", str(spec.epochs), "--batch-size", str(spec.batch_size),
        "--learning-rate", repr(spec.learning_rate),
        "--min-trainers", str(spec.min_trainers), "--max-trainers", str(spec.max_trainers),
        "--trainers", str(spec.trainers), "--checkpoint-uri", spec.checkpoint_uri,
        "--checkpoint-interval", repr(spec.checkpoint_interval_s),
        "--keep-checkpoints", str(spec.keep_checkpoints), "--rows-per-task", str(spec.rows_per_task),
        "--max-task-failures", str(spec.max_task_failures), "--seed", str(spec.seed),
    ]
    if spec.eval_data:
        argv += ["--eval-data", spec.eval_data]
    if spec.audit:
        argv.append("--audit")
    return argv
