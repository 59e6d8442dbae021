"""The documentation: the site builds strict (broken links, missing pages and anchors fail), its reference
pages come from the code, the README stays short and its links resolve, and every command block of
``docs/getting-started.md`` runs as written.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README_MAX_LINES = 260

# A command block of getting-started.md and the marker above it: <!-- test: HOW -->
BLOCK = re.compile(r"(?:<!-- test: (?P<how>[^>]*?) -->\n)?```bash\n(?P<body>.*?)```", re.S)


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["NO_MKDOCS_2_WARNING"] = "1"  # Material's banner about MkDocs 2.0
    env.update(extra)
    return env


@pytest.mark.timeout(180)
def test_the_site_builds_strict_with_its_reference_generated_from_the_code(tmp_path):
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(site)], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=170)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "WARNING" not in r.stderr, r.stderr[-4000:]
    cli = (site / "reference" / "cli" / "index.html").read_text()
    for words in ("edl train", "edl launch", "edl k8s render", "edl data prepare", "edl serve"):
        assert f"<code>{words}</code>" in cli, words
    assert "--max-trainer-failures" in cli  # a flag's help, as argparse prints it
    component = (site / "reference" / "component" / "index.html").read_text()
    assert "elastic_train" in component and "min_trainers" in component
    assert (site / "changelog" / "index.html").exists()


def test_the_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local, "the README links to the docs"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing


def _blocks(text: str) -> list[tuple[str, str]]:
    return [(m["how"] or "", m["body"]) for m in BLOCK.finditer(text)]


def test_every_command_block_of_getting_started_says_how_it_is_tested():
    blocks = _blocks((DOCS / "getting-started.md").read_text())
    assert blocks
    for how, body in blocks:
        assert how, f"a command block with no <!-- test: ... --> marker:\n{body}"
        if how not in ("run", "background", "while the job runs"):
            tests = re.findall(r"tests/\S+\.py", how)  # run elsewhere: the marker names the test
            assert tests and all((ROOT / t).exists() for t in tests), how


@pytest.mark.timeout(400)
def test_the_first_job_of_getting_started_runs_as_written(tmp_path):
    """The blocks marked run, background and "while the job runs", in order, in one shell, in a fresh
    directory with the suite's environment as ``.venv``. Before a "while the job runs" block, its first
    command (``edl status``) is retried until it shows the job training."""
    script = ["set -eo pipefail"]
    for how, body in _blocks((DOCS / "getting-started.md").read_text()):
        if how == "while the job runs":
            first = body.strip().splitlines()[0].split("#")[0].strip()
            script.append(f"for _ in $(seq 600); do {first} 2>/dev/null | grep -q 'phase running' && break; sleep 0.2; done")
        if how in ("run", "background", "while the job runs"):
            script.append(body)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=tmp_path, env=_env(EDL_HOME=str(tmp_path / "home")),
                       capture_output=True, text=True, timeout=380)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "synth.json").read_text())
    assert summary["status"] == "succeeded", summary["error"]
    assert summary["lost_samples"] == 0 and summary["duplicate_samples"] == 0
    assert any(g["reason"] == "scale_up" and g["world_size"] == 3 for g in summary["generations"]), summary
    assert "desired trainers set to 3" in r.stdout
    assert summary["metrics"]["accuracy"] > 0.5  # 10 classes: a guess scores 0.1
