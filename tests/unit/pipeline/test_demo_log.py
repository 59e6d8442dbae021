"""``edl demo``'s output for people: kfp.local's lines go to the log file whole, and only the
pipeline's events (a step started or ended, the training's own events) reach the console."""

from __future__ import annotations

import io
import logging

from rich.console import Console

from edl.console import THIRD_PARTY_LOGGERS, quiet_third_party_logs
from edl.pipeline.demo import DemoView, PipelineLog, classify

# As kfp.local 2.17 prints them (its task names and statuses in ANSI colours, streamed output indented).
STARTED = "18:00:01.123 - INFO - Executing task \x1b[96m'elastic-train'\x1b[0m"
ENDED = "18:00:31.456 - INFO - Task \x1b[96m'elastic-train'\x1b[0m finished with status \x1b[92mSUCCESS\x1b[0m"
GENERATION = "    generation 2: 1 → 2 trainers (scale_up), pause 0.41 s"
DUMP = '    2026-12-01 18:00:02 INFO Got executor_input:\n    {\n        "inputs": {"parameterValues": {}}\n    }'
HTTP = "    2026-12-01 18:00:03 httpx HTTP Request: GET http://127.0.0.1:4242/v1/status \"HTTP/1.1 200 OK\""
ERROR = "    edl.errors.UserError: pipeline parameter epochs: must be at least 1 (got 0)"


def test_classify_finds_the_events_and_leaves_the_rest_to_the_log():
    assert classify(STARTED) == ("started", "elastic-train")
    assert classify(ENDED) == ("ended", "elastic-train: SUCCESS")
    assert classify(GENERATION) == ("event", "generation 2: 1 → 2 trainers (scale_up), pause 0.41 s")
    assert classify(ERROR) == ("error", "edl.errors.UserError: pipeline parameter epochs: must be at least 1 (got 0)")
    for line in (*DUMP.splitlines(), HTTP, "", "    epoch 3/60:  40.0 % · 2 trainers · step 120"):
        assert classify(line) is None, line


def test_the_log_holds_everything_the_console_only_the_events(tmp_path):
    out = io.StringIO()
    view = DemoView(Console(file=out, width=60), tmp_path, 0.0)  # not a terminal: lines, no bar, no polling
    path = tmp_path / "pipeline.log"
    with view, PipelineLog(path, view.event) as log:
        # Written in pieces, as a stream is: a line may arrive in parts.
        text = "\n".join([STARTED, DUMP, HTTP, GENERATION, ERROR, ENDED]) + "\n"
        for i in range(0, len(text), 7):
            log.write(text[i:i + 7])
    assert path.read_text() == text
    printed = out.getvalue().splitlines()
    assert printed[0] == "step elastic-train started"
    assert printed[1] == "  generation 2: 1 → 2 trainers (scale_up), pause 0.41 s"
    assert printed[2].startswith("step elastic-train: success in ") and len(printed) == 3
    assert log.last_error == "edl.errors.UserError: pipeline parameter epochs: must be at least 1 (got 0)"


def test_third_party_request_logs_are_off_unless_asked_for(monkeypatch):
    for name in THIRD_PARTY_LOGGERS:
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    monkeypatch.setenv("EDL_VERBOSE", "1")
    quiet_third_party_logs()
    assert all(logging.getLogger(n).level == logging.NOTSET for n in THIRD_PARTY_LOGGERS)  # left as they were
    monkeypatch.delenv("EDL_VERBOSE")
    quiet_third_party_logs()
    assert all(logging.getLogger(n).level == logging.WARNING for n in THIRD_PARTY_LOGGERS)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)


def test_on_a_terminal_the_events_print_above_a_bar_that_stops_cleanly(tmp_path):
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=True)
    with DemoView(console, tmp_path, 0.0) as view:  # no job under tmp_path yet: the poller finds none
        view.event("started", "elastic-train")
        view.event("event", "generation 1: 0 → 2 trainers (start), pause 0.43 s")
        assert view.poller.is_alive()
    assert not view.poller.is_alive()
    assert "step elastic-train started" in out.getvalue() and "generation 1: 0 → 2 trainers" in out.getvalue()
