"""A PostgreSQL server of a test's own: initdb'd in a temporary directory, on a port
of its own, holding a copy of the test database. A test that restarts PostgreSQL
restarts this one, so it can run beside the others, which share the machine's server.

    with PrivateServer() as server, server.serving(connection):
        ...  # every connection made here, and DATABASE_URL of the processes
             # started here, go to the private server; server.restart_command()
             # is what restarts it

The server's binaries are the newest under /usr/lib/postgresql (Debian's layout), or
those on PATH. Run as root, each command runs as the `postgres` user, as the server
refuses to run as root.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.processes import free_port


def binaries() -> Path | None:
    """The directory of initdb, pg_ctl, pg_dump and psql; None when there is none."""
    debian = sorted(
        (p for p in Path("/usr/lib/postgresql").glob("*/bin") if p.parent.name.isdigit()),
        key=lambda p: int(p.parent.name),
        reverse=True,
    )
    for directory in [*debian, *(Path(p) for p in os.environ.get("PATH", "").split(":") if p)]:
        if all((directory / tool).exists() for tool in ("initdb", "pg_ctl", "pg_dump", "psql")):
            return directory
    return None


class PrivateServer:
    """One server in a temporary directory, stopped and removed on exit."""

    def __init__(self):
        found = binaries()
        if found is None:
            raise FileNotFoundError("no initdb and pg_ctl (PostgreSQL's server package)")
        self.bin = found
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="webhooker-pg-"))
        self.data = self.dir / "data"
        self._as = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, tool: str, *args, **kwargs) -> subprocess.CompletedProcess:
        return self._call([*self._as, str(self.bin / tool), *args], **kwargs)

    @staticmethod
    def _call(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(argv, check=True, capture_output=True, timeout=120, **kwargs)

    def __enter__(self) -> PrivateServer:
        try:
            # --no-sync: the directory is thrown away; the server itself runs with
            # the defaults, fsync on.
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            )
            options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
            self._call(self._pg_ctl("-o", options, "start"))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.SubprocessError):
                self._call(self._pg_ctl("-m", "immediate", "stop"))
        shutil.rmtree(self.dir, ignore_errors=True)

    def restart_command(self) -> list[str]:
        """What restarts the server as `pg_ctlcluster ... restart` does: a fast
        shutdown (every session ended), then started with the same options. The
        log file again: without one the server would write to, and hold open, the
        caller's pipes."""
        return [*self._pg_ctl("-m", "fast"), "restart"]

    def _pg_ctl(self, *args) -> list[str]:
        return [
            *self._as,
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "server.log"),
            "-w",
            *args,
        ]

    def copy(self, settings_dict: dict) -> None:
        """The database `settings_dict` names, schema and rows, under the same name."""
        source = [
            "-h",
            settings_dict["HOST"] or "127.0.0.1",
            "-p",
            str(settings_dict["PORT"] or 5432),
            "-U",
            settings_dict["USER"],
        ]
        here = ["-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"]
        name = settings_dict["NAME"]
        self._run("psql", *here, "-d", "postgres", "-q", "-c", f'CREATE DATABASE "{name}"')
        dump = self._call(
            [str(self.bin / "pg_dump"), *source, "--no-owner", "--no-privileges", name],
            env={**os.environ, "PGPASSWORD": settings_dict.get("PASSWORD") or ""},
        )
        self._run("psql", *here, "-d", name, "-q", "-v", "ON_ERROR_STOP=1", input=dump.stdout)

    @contextlib.contextmanager
    def serving(self, connection):
        """Point Django's `connection` at this server, on a copy of its database, for
        the block: the connections opened meanwhile on any thread, and the processes
        started (tests.support.processes.database_url), use it."""
        from django.conf import settings
        from django.db import connections

        # The same dict in one, two or three places, as Django's test setup left them.
        dicts = {
            id(d): d
            for d in (
                connection.settings_dict,
                connections.settings[connection.alias],
                settings.DATABASES[connection.alias],
            )
        }.values()
        original = dict(connection.settings_dict)
        self.copy(original)
        connection.close()
        for d in dicts:
            d.update(HOST="127.0.0.1", PORT=str(self.port))
        try:
            yield self
        finally:
            connection.close()
            for d in dicts:
                d.update(HOST=original["HOST"], PORT=original["PORT"])
