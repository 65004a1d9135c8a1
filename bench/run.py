"""`make bench`: every figure on SQLite and on PostgreSQL (suffix _pg).

Prints one name=value line per figure and records the run at the top of
bench/RESULTS.md with the date, commit, machine and command. BENCH_SECONDS
(default 10) is the length of each phase; BENCH_DATABASES=sqlite or =pg runs one.
"""

import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"
PG_ADMIN = os.environ.get("BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
PG_DB = "webhooker_bench"

TARGETS = {
    "ingest_ratio": (">=", 0.6),
    # Verified and deduplicated ingest against plain ingest (issue: within 10 %).
    "ingest_ratio_verified": (">=", 0.9),
    "delivery_ratio": (">=", 0.7),
    "e2e_p50_ms": ("<=", 20),
    "e2e_p99_ms": ("<=", 100),
    "vs_celery_ratio": (">=", 1.5),
    "engine_rss_mb_10k": ("<=", 150),
    # The inbound edge under hostile load (issue 15).
    "slow_senders_p99_ratio": ("<=", 2),
    "flood_recovery_s": ("<=", 5),
    "prune_ingest_p95_ratio": ("<=", 2),
    "e2e_load_p99_ms": ("<=", 100),
    # Many engines on one PostgreSQL (issue 10): 4 engines / 1 on a 50 ms receiver.
    "scaleout_ratio_4": (">=", 3.5),
    # Attempts in flight (issue 26; bench/inflight.py).
    "slow_receiver_ratio": (">=", 0.85),
    "engine_cpu_per_delivery_ratio": ("<=", 1.5),
    "engine_rss_mb_5k_inflight": ("<=", 250),
    "ordered_lane_ratio": (">=", 0.8),
    # Target transforms (issue 27): deliveries/s with a small jq program / without.
    "transform_ratio": (">=", 0.7),
}


def fresh_pg_database():
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {PG_DB}")
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + PG_DB


def run_suite(database):
    data_dir = Path(tempfile.mkdtemp(prefix=f"webhooker-bench-{database}-"))
    env = {
        **os.environ,
        "DATA_DIR": str(data_dir),
        # webhooker's settings plus the baseline routes (bench/urls.py).
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        # As `make run` serves, but without DEBUG's per-query bookkeeping, which a
        # deployment would not pay either.
        "DEBUG": "0",
        "WEBHOOKER_ALLOWED_TARGET_NETWORKS": "127.0.0.0/8",
        "LOG_LEVEL": "warning",
        "GUNICORN_LOG_LEVEL": "warning",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if database == "pg":
        env["DATABASE_URL"] = fresh_pg_database()
    else:
        env.pop("DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "suite.py")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    if result.returncode:
        raise SystemExit(f"bench suite on {database} failed (logs in {data_dir})")
    shutil.rmtree(data_dir, ignore_errors=True)
    suffix = "_pg" if database == "pg" else ""
    figures = {}
    for line in result.stdout.splitlines():
        name, _, value = line.partition("=")
        figures[name + suffix] = float(value)
    return figures


def verdict(name, value):
    base = name.removesuffix("_pg")
    if base not in TARGETS:
        return ""
    op, goal = TARGETS[base]
    met = value >= goal if op == ">=" else value <= goal
    return f"{'met' if met else 'MISSED'} ({op} {goal})"


def record(figures, seconds, databases):
    commit = (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        or "unknown"
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.system()} {platform.release()}"
    )
    only = "" if databases == ["sqlite", "pg"] else f" BENCH_DATABASES={','.join(databases)}"
    lines = [
        f"## {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, commit {commit}"
        f"{' (with uncommitted changes)' if dirty else ''}",
        "",
        f"Machine: {machine}. Command: `BENCH_SECONDS={seconds:g}{only} make bench`.",
        "",
        "| figure | value | target |",
        "|---|---|---|",
    ]
    lines += [
        f"| `{name}` | {value:.2f} | {verdict(name, value)} |" for name, value in figures.items()
    ]
    section = "\n".join(lines) + "\n"
    header = "# Benchmark results\n\nNewest first. Produced by `make bench` (bench/run.py).\n\n"
    old = RESULTS.read_text() if RESULTS.exists() else header
    body = old[len(header) :] if old.startswith(header) else old
    RESULTS.write_text(header + section + "\n" + body)


def main():
    for tool in ("wrk", "nginx"):
        if not shutil.which(tool):
            raise SystemExit(
                f"{tool} is missing: apt-get install wrk nginx-light (make bench does)"
            )
    seconds = float(os.environ.setdefault("BENCH_SECONDS", "10"))
    databases = [d.strip() for d in os.environ.get("BENCH_DATABASES", "sqlite,pg").split(",")]
    figures = {}
    for database in databases:
        print(f"# {database}", file=sys.stderr, flush=True)
        figures.update(run_suite(database))
    for name, value in figures.items():
        print(f"{name}={value:.3f}")
    if os.environ.get("BENCH_RECORD", "1") == "1":
        record(figures, seconds, databases)


if __name__ == "__main__":
    main()
