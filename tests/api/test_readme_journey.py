"""The README's API journey, run as written: its shell block against a real
`manage.py serve` (what `make run` serves), with curl and jq, and the receiver it
starts itself. Only the ports are changed, so that tests may run side by side."""

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model

from tests.support.processes import ROOT, Process, free_port, process_env, wait_answering

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]


def journey() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### The journey, with curl") :]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def test_the_readme_journey_runs_as_written(data_dir):
    for tool in ("curl", "jq"):
        if shutil.which(tool) is None:
            pytest.skip(f"the journey needs {tool}")
    if not (ROOT / ".venv/bin/python").exists():
        pytest.skip("the journey runs .venv/bin/python, which make test creates")
    get_user_model().objects.create_superuser("admin", "admin@example.com", "x")
    web_port, receiver_port = free_port(), free_port()
    script = journey().replace("localhost:8080", f"localhost:{web_port}")
    script = script.replace("9000", str(receiver_port))
    env = process_env(
        data_dir,
        WEBHOOKER_BIND=f"127.0.0.1:{web_port}",
        WEB_CONCURRENCY=1,
        WEBHOOKER_ALLOWED_TARGET_NETWORKS="127.0.0.0/8",
        DELIVERY_POLL_INTERVAL="0.2",
    )
    serve = Process([sys.executable, "manage.py", "serve"], env, data_dir / "serve.log")
    shell = None
    try:
        wait_answering(f"http://127.0.0.1:{web_port}/admin/login/", serve)
        shell = subprocess.Popen(
            ["bash", "-c", script],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        output, _ = shell.communicate(timeout=120)
    finally:
        if shell is not None and shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
        serve.stop(signal.SIGTERM)
    assert shell.returncode == 0, output
    assert '{"queued":1,"matched":1}' in output.replace(" ", ""), output
    final = output[output.rindex('{\n  "status"') :]
    assert '"status": "delivered"' in final and '"attempts": 2' in final, output
