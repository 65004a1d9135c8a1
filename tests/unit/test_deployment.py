"""What the deployment files promise, read from the files themselves."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def locked() -> dict[str, str]:
    text = (ROOT / "requirements.lock").read_text()
    return {
        name.lower().replace("_", "-"): version
        for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==([^ \\\n]+)", text, re.M)
    }


def test_the_lock_holds_every_pin_of_pyproject_with_hashes():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # Extras ("psycopg[binary]") are the package's own pins too: psycopg, psycopg-binary.
    # A pin's environment marker ("; sys_platform == ...") is not part of its version.
    pins = {
        re.sub(r"\[.*\]", "", name): version.strip()
        for name, version in (pin.split(";")[0].split("==") for pin in project["dependencies"])
    }
    lock = locked()
    stale = {
        name: (version, lock.get(name.lower()))
        for name, version in pins.items()
        if lock.get(name.lower()) != version
    }
    assert not stale, f"requirements.lock is out of date (make lock): {stale}"
    text = (ROOT / "requirements.lock").read_text()
    for block in re.split(r"\n(?=[A-Za-z0-9_.-]+==)", text.split("\n\n", 1)[-1]):
        if "==" in block.split("\n", 1)[0]:
            assert "--hash=sha256:" in block, block.split("\n", 1)[0]
    # This machine's package mirrors must not end up in the image's install.
    assert not re.search(r"^--(extra-)?index-url|^--find-links", text, re.M)


def test_the_image_installs_from_the_lock_and_leaves_env_files_out():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--require-hashes" in dockerfile and "requirements.lock" in dockerfile
    assert "pip install --no-deps" in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".env" in ignored and ".env.*" in ignored


def test_no_web_replica_migrates_at_start():
    web = (ROOT / "deploy" / "webhooker-web.service").read_text()
    assert "migrate" not in "\n".join(line for line in web.splitlines() if not line.startswith("#"))
    once = (ROOT / "deploy" / "webhooker-migrate.service").read_text()
    assert "Type=oneshot" in once and "manage.py migrate" in once
