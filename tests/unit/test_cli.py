"""Every flag of every ``edl`` command is checked before anything starts: a bad value (nan, inf, out
of range) is one line naming the flag, exit 2, nothing written. The commands run in this process
and stop at their checks, so none of them may get as far as a process, a socket or a file."""

from __future__ import annotations

import pytest

from edl.cli import build_parser, main

JOB = ["--job-name", "j", "--model-def", "edl.zoo.digits", "--data", "d", "--epochs", "1", "--batch-size", "4"]
S3_JOB = [*JOB[:4], "--data", "s3://bkt/d", *JOB[6:], "--checkpoint-uri", "s3://bkt/ck", "--s3-secret", "s3"]

# (command line, what the error line must say): each flag of each command with a value that must be refused.
BAD = [
    (["serve", "model", "--host", "localhost"], "--host 'localhost': not an IP address"),
    (["serve", "model", "--port", "0"], "--port must be 1..65535 (got 0)"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--learning-rate", "nan"], "--learning-rate must be a positive number (got nan)"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--learning-rate", "inf"], "--learning-rate must be a positive number (got inf)"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--learning-rate", "-0.1"], "--learning-rate must be a positive number"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--checkpoint-interval", "-1"], "--checkpoint-interval must be a positive"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--checkpoint-interval", "0"], "--checkpoint-interval must be a positive"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--checkpoint-interval", "nan"], "--checkpoint-interval must be a positive"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--rows-per-task", "-1"], "--rows-per-task must be at least 1, or 0 for 4 x --batch-size"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--max-task-failures", "0"], "--max-task-failures must be at least 1"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--max-trainer-failures", "-1"], "--max-trainer-failures must be 0 or more"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--keep-checkpoints", "0"], "--keep-checkpoints must be at least 1"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--seed", "-1"], "--seed must be in 0..4294967295"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--launcher-timeout", "inf"], "--launcher-timeout must be a number of seconds"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--launcher-timeout", "nan"], "--launcher-timeout must be a number of seconds"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--autoscale-slots", "2", "--sidecar-period", "nan"], "--sidecar-period must be a positive"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--autoscale-slots", "2", "--sidecar-period", "inf"], "--sidecar-period must be a positive"),
    (["train", *JOB, "--checkpoint-uri", "ck", "--autoscale-slots", "0"], "--autoscale-slots 0 is below --min-trainers 1"),
    (["master", *JOB, "--checkpoint-uri", "ck", "--port", "70000"], "--port must be in 1..65535"),
    (["master", *JOB, "--checkpoint-uri", "ck", "--learning-rate", "nan"], "--learning-rate must be a positive number"),
    (["launch", *S3_JOB, "--max-trainer-failures", "-1"], "--max-trainer-failures must be 0 or more"),
    (["launch", *S3_JOB, "--learning-rate", "inf"], "--learning-rate must be a positive number (got inf)"),
    (["launch", *S3_JOB, "--sidecar-period", "nan"], "--sidecar-period must be a positive"),
    (["launch", *S3_JOB, "--sidecar-jitter", "nan"], "--sidecar-jitter must be in [0, --sidecar-period)"),
    (["launch", *S3_JOB, "--pending-timeout", "inf"], "--pending-timeout must be a positive number of seconds"),
    (["launch", *S3_JOB, "--node-lost-timeout", "-5"], "--node-lost-timeout must be a positive number of seconds"),
    (["launch", *S3_JOB, "--trainer-gpu", "-1"], "--trainer-gpu must be 0 or more"),
    (["k8s", "render", *S3_JOB, "--out", "OUT", "--max-task-failures", "0"], "--max-task-failures must be at least 1"),
    (["k8s", "render", *S3_JOB, "--out", "OUT", "--sidecar-period", "inf"], "--sidecar-period must be a positive"),
    (["launch", *S3_JOB, "--sidecar-period", "nan"], "--sidecar-period must be a positive number of seconds (got nan)"),
    (["launch", *S3_JOB, "--sidecar-jitter", "-1"], "--sidecar-jitter must be in [0, --sidecar-period)"),
    (["launch", *S3_JOB, "--sidecar-policy", "greedy"], "--sidecar-policy 'greedy': choose"),
    (["data", "prepare", "digits", "--out", "OUT", "--shards", "0"], "--shards must be at least 1"),
    (["data", "prepare", "digits", "--out", "OUT", "--shards", "5000"], "--shards 5000 is more than the"),
    (["data", "prepare", "digits", "--out", "OUT", "--seed", "-1"], "--seed must be in 0..4294967295"),
    (["data", "prepare", "synthetic", "--out", "OUT", "--rows", "5"], "--rows must be at least 10"),
    (["data", "prepare", "synthetic", "--out", "OUT", "--classes", "1"], "--classes must be at least 2"),
    (["simulate", "--scenario", "seed-case1", "--runs", "0"], "--runs must be at least 1"),
    (["demo", "--out", "OUT", "--epochs", "0"], "--epochs must be at least 1"),
    (["pipeline", "compile", "--out", "OUT", "--registry", "has space"], "--registry"),
]


@pytest.mark.parametrize("argv, needle", BAD, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD])
def test_a_bad_flag_is_one_line_naming_it_exit_2_and_nothing_written(argv, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # relative paths (ck, OUT) land here: nothing may appear
    monkeypatch.setenv("EDL_TOKEN", "t")
    argv = [str(tmp_path / "OUT") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("edl: error: ") and needle in err, err
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())  # no EDL_HOME (tmp_path/edl-home), no OUT


def test_help_says_what_zero_means_where_zero_means_something():
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices  # the subcommands' parsers
    helps = {name: p.format_help().replace("\n", " ") for name, p in sub.items()}
    squash = {name: " ".join(h.split()) for name, h in helps.items()}
    assert "0: 4 x --batch-size" in squash["train"]
    assert "0: at the first crash" in squash["train"] and "0: at the first crash" in squash["launch"]
    assert "0: no offset" in squash["launch"]
    assert "0: CPU trainers" in squash["launch"]
    assert "sidecar" not in sub  # the sidecar is a thread of the launcher, not a command
