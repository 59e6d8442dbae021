from __future__ import annotations

import pytest

from edl.api.spec import JobSpec, job_problems
from edl.errors import UserError
from edl.jobargs import FLAG_NAMES
from edl.storage.store import open_store


def spec(**kw) -> JobSpec:
    base = dict(job="j", model_def="m", data="d", epochs=1, batch_size=4, min_trainers=1, max_trainers=3,
                trainers=2, checkpoint_uri="/tmp/x")
    base.update(kw)
    return JobSpec(**base)


@pytest.mark.parametrize("kw, match", [
    ({"min_trainers": 4}, "--min-trainers 4 is greater than --max-trainers 3"),
    ({"trainers": 5}, "--trainers 5 is outside"),
    ({"epochs": 0}, "--epochs"),
    ({"batch_size": 0}, "--batch-size"),
    ({"job": "a b"}, "--job-name"),
    ({"launcher_timeout_s": 5.0}, "--launcher-timeout must be at least 10 seconds"),
])
def test_bad_spec_names_the_flag(kw, match):
    with pytest.raises(UserError, match=match):
        FLAG_NAMES.check(job_problems(spec(**kw)))


def test_unknown_uri_scheme_is_named():
    with pytest.raises(UserError, match="unknown URI scheme 'gs'"):
        open_store("gs://bucket/x", "--checkpoint-uri")
