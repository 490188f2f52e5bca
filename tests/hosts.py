"""Several hosts on this machine, crossed by a real network: a test cluster of network namespaces.

Each host is a set of namespaces of its own. Its network (``ip netns add``): one interface
(``eth0``), an address on a private subnet and no default route, joined to the others through a
bridge in a "switch" namespace (a veth pair per host), so traffic between hosts crosses a network
stack and never the machine's own interfaces. Its hostname, mounts and PIDs (``unshare --uts --mount
--pid``, held by a small init, PID 1 of the host): its own ``/tmp`` (a folder under the cluster's base
bind-mounted there, as a node's local disk) and its own ``/proc``, so a process sees only its host's
processes (``ray stop``, or a kill by command line, on one host never reaches another's); the user's
home is the cluster's shared one (``Hosts.home``, bound over this machine's home, whose Python
toolchain folders are bound back in), as an NFS home is on a real cluster; everything else is the one
filesystem, the cluster's shared folder among it. A command enters all of them with ``nsenter --target INIT`` (not ``ip netns exec``: it
remounts /sys and hides /sys/fs/cgroup, and slurmd will not start then). Host names do not resolve
(/etc/hosts is the machine's, left alone), as on compute nodes without DNS.

The shared folder is one kernel's: every host shares its locks, page cache and write order, which no
network filesystem gives. Opt in to a real one with :func:`share_over_sshfs`: a storage host serves a
folder over SSH and the others mount it with sshfs at the same path, each in its own mount namespace
(tests/orchestrator/test_shared_fs.py; tests/shared_fs_sqlite.py shows SQLite written from two hosts).

Everything is started by PID and stopped by PID (the whole tree, SIGKILL after a grace), the
namespaces deleted and the base removed, pass or fail (:meth:`Hosts.close`, also on ``with``). A
second ``Hosts`` in another process takes another subnet and other names (both keyed by PID).

Used by the multi-host tests (tests/orchestrator/test_multihost.py) and ``make cluster``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pg_server  # tests/pg_server.py: the PostgreSQL server binaries, initdb as every test server runs it
from waiting import until  # tests/waiting.py

from orchestrator.cluster.processes import kill_pids

# A host's first process, under `unshare`: its hostname, its /tmp (its own, bound from the base), the
# user's home: the cluster's shared one (bound over this machine's, whose Python toolchain folders are
# bound back into it), then its init (PID 1 of the host's PID namespace), which reaps the orphans the
# host's daemons leave.
_ENTER = """hostname "$1" && mount --bind "$2" /tmp && real="$3" && home="$4" && shift 4 &&
mkdir /tmp/.machine-home && mount --bind "$real" /tmp/.machine-home && mount --bind "$home" "$real" &&
for kept in $HOSTS_TOOLCHAIN; do mkdir -p "$real/$kept" && mount --bind "/tmp/.machine-home/$kept" "$real/$kept"; done &&
exec "$@"
"""
_INIT = "import os, time\nwhile True:\n    try:\n        os.wait()\n    except ChildProcessError:\n        time.sleep(0.5)\n"


def _toolchain(home: Path) -> list[str]:
    """The folders of ``home`` this Python lives in (e.g. ``.pyenv``), kept visible on every host."""
    places = {Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable))}
    return sorted({place.relative_to(home).parts[0] for place in places if place.is_relative_to(home)})


def missing_tools() -> list[str]:
    """What a multi-host test needs and this machine lacks (it runs as root)."""
    need = ("ip", "nsenter", "unshare", "mount")
    lacking = [tool for tool in need if not shutil.which(tool)]
    return lacking + ([] if os.geteuid() == 0 else ["root"])


@dataclass
class Host:
    name: str
    address: str
    netns: str
    veth: str  # its end in the switch namespace (cut to take the host off the network)
    tmp: Path  # its node-local /tmp
    init: int = 0  # PID (on this machine) of its PID namespace's init: commands enter its namespaces
    processes: list[subprocess.Popen] = field(default_factory=list)


class Hosts:
    """``Hosts(["login", "head", "w1"])``: those hosts up on one subnet; ``run``/``popen`` on them."""

    def __init__(self, names: list[str], base: Path | None = None):
        tag = os.getpid() % 50_000
        self.tag = f"hs{tag}"
        # 10.(200 + tag / 256 % 50).(tag % 256).0/24: a /24 of this process's own, never the machine's
        self.subnet = f"10.{200 + tag // 256 % 50}.{tag % 256}"
        self.base = Path(base or tempfile.mkdtemp(prefix=f"hosts-{self.tag}-", dir="/var/tmp"))
        self.shared = self.base / "shared"  # the cluster's shared filesystem (a home on NFS)
        self.home = self.shared / "home"  # the user's home on every host (~ there; this machine's is left alone)
        self.switch = f"{self.tag}-sw"
        self.hosts: dict[str, Host] = {}
        self.names = names
        self.up = False
        self.closing: list[Callable[[], None]] = []  # run first by close(), last added first (unmounts)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ the network

    def _ip(self, *args: str, netns: str | None = None) -> None:
        command = ["ip", *(["-n", netns] if netns else []), *args]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{shlex.join(command)}: {done.stderr.strip()}")

    def _start(self) -> None:
        self.shared.mkdir(parents=True, exist_ok=True)
        self.shared.chmod(0o755)
        self.home.mkdir(mode=0o700)
        self._ip("netns", "add", self.switch)
        self.up = True
        self._ip("link", "add", "br0", "type", "bridge", netns=self.switch)
        self._ip("link", "set", "br0", "up", netns=self.switch)
        for number, name in enumerate(self.names, start=10):
            netns, veth = f"{self.tag}-{name}", f"v{number}"
            self._ip("netns", "add", netns)
            # the pair is made in the host's namespace, one end then moved to the switch's
            self._ip("link", "add", "eth0", "type", "veth", "peer", "name", veth, netns=netns)
            self._ip("link", "set", veth, "netns", self.switch, netns=netns)
            self._ip("link", "set", veth, "master", "br0", netns=self.switch)
            self._ip("link", "set", veth, "up", netns=self.switch)
            address = f"{self.subnet}.{number}"
            self._ip("addr", "add", f"{address}/24", "dev", "eth0", netns=netns)
            self._ip("link", "set", "eth0", "up", netns=netns)
            self._ip("link", "set", "lo", "up", netns=netns)
            tmp = self.base / "local" / name / "tmp"
            tmp.mkdir(parents=True)
            tmp.chmod(0o1777)
            self.hosts[name] = Host(name, address, netns, veth, tmp)
            self.hosts[name].init = self._boot(self.hosts[name])

    def _boot(self, host: Host) -> int:
        """The host's namespaces beside its network: hostname, mounts (its /tmp, its own /proc) and
        PIDs, held by an init; its PID. A process on one host sees only that host's processes, as on a
        real machine (``ray stop`` or a kill by command line on one host never reaches another's)."""
        real = Path.home()
        process = subprocess.Popen(
            ["nsenter", f"--net=/var/run/netns/{host.netns}", "unshare", "--uts", "--mount", "--propagation", "private",
             "--pid", "--fork", "--mount-proc", "sh", "-c", _ENTER, "sh", host.name, str(host.tmp), str(real),
             str(self.home), sys.executable, "-c", _INIT],
            env=os.environ | {"HOSTS_TOOLCHAIN": " ".join(_toolchain(real))}, start_new_session=True)
        host.processes.append(process)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
            for child in (children.read_text().split() if children.exists() else []):
                if "os.wait()" in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"):
                    return int(child)
            if process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"host {host.name} did not boot (unshare exited {process.poll()})")

    def address(self, name: str) -> str:
        return self.hosts[name].address

    def cut(self, name: str) -> None:
        """Take ``name`` off the network (its switch port down): its processes live on, unreachable."""
        self._ip("link", "set", self.hosts[name].veth, "down", netns=self.switch)

    def restore(self, name: str) -> None:
        self._ip("link", "set", self.hosts[name].veth, "up", netns=self.switch)

    # ------------------------------------------------------------------ processes on a host

    def command(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` as run on host ``name``: its network, hostname, mounts (its /tmp) and PIDs."""
        return ["nsenter", f"--target={self.hosts[name].init}", "--net", "--uts", "--mount", "--pid", "--", *argv]

    def popen(self, name: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` on ``name`` (kwargs as ``subprocess.Popen``'s); stopped by :meth:`close`."""
        process = subprocess.Popen(self.command(name, argv), start_new_session=True, **kwargs)
        self.hosts[name].processes.append(process)
        return process

    def run(self, name: str, argv: list[str], timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``name`` to its end (text output captured unless kwargs say otherwise)."""
        kwargs = {"capture_output": True, "text": True} | kwargs
        return subprocess.run(self.command(name, argv), timeout=timeout, **kwargs)

    def sh(self, name: str, script: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        return self.run(name, ["sh", "-c", script], timeout=timeout, **kwargs)

    def pids(self, name: str) -> set[int]:
        """Every process in host ``name``'s network namespace (whoever started it: slurmd's jobs too)."""
        done = subprocess.run(["ip", "netns", "pids", self.hosts[name].netns], capture_output=True, text=True)
        return {int(pid) for pid in done.stdout.split()}

    def listening(self, name: str) -> list[tuple[str, int, str]]:
        """(address, port, program) of every TCP socket listening on host ``name``."""
        done = subprocess.run(["ip", "netns", "exec", self.hosts[name].netns, "ss", "-Hltnp"],
                              capture_output=True, text=True)
        found = []
        for line in done.stdout.splitlines():
            words = line.split()
            address, _, port = words[3].rpartition(":")
            program = words[5].split('"')[1] if len(words) > 5 and '"' in words[5] else "?"
            found.append((address.strip("[]"), int(port), program))
        return sorted(set(found))

    # ------------------------------------------------------------------ teardown

    def kill_host(self, name: str, grace_s: float = 5.0) -> None:
        """Stop every process on host ``name`` (also those it forks meanwhile): SIGTERM, then SIGKILL
        after ``grace_s``."""
        kill_pids(lambda: self.pids(name), grace_s)
        for process in self.hosts[name].processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        while self.closing:
            try:
                self.closing.pop()()
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
        for name in self.hosts:
            try:
                self.kill_host(name)
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
        if self.up:
            for host in self.hosts.values():
                subprocess.run(["ip", "netns", "delete", host.netns], capture_output=True)
            subprocess.run(["ip", "netns", "delete", self.switch], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)
        self.up = False

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def leftovers(tag_prefix: str = "hs") -> list[str]:
    """Network namespaces a Hosts of this process did not delete (for a session-end check)."""
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    mine = f"{tag_prefix}{os.getpid() % 50_000}-"
    return [line.split()[0] for line in done.stdout.splitlines() if line.startswith(mine)]


# --------------------------------------------------------------------------- SLURM across the hosts

SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scancel", "scontrol", "squeue", "sinfo", "srun")


def start_slurm(hosts: Hosts, controller: str, computes: list[str], cpus: int, gpus: int,
                first_job: int, munge_per_host: bool = False) -> dict[str, str]:
    """SLURM on the hosts: slurmctld on ``controller``, a slurmd on each of ``computes`` (its own
    hostname and NodeAddr, ``cpus`` CPUs and ``gpus`` GPUs as gres without devices), one munged (its
    socket a path every host reaches; ``munge_per_host``: a munged on every host instead, as on a real
    cluster, each with its own copy of the key and its socket in the host's /tmp), the config on the
    shared filesystem; the environment its clients need (``SLURM_CONF``). Its daemons are processes of ``hosts``: :meth:`Hosts.close` stops
    them, jobs and all."""
    lacking = [tool for tool in SLURM_TOOLS if not shutil.which(tool)]
    if lacking:
        raise RuntimeError(f"{', '.join(lacking)} not found: apt-get install slurm-wlm munge (.ci/run does)")
    base = hosts.shared / "slurm"
    munge = base / "munge"
    for folder in (munge, base / "state", base / "spool", base / "log"):
        folder.mkdir(parents=True)
    munge.chmod(0o711)
    (munge / "key").write_bytes(os.urandom(1024))
    (munge / "key").chmod(0o400)
    user = subprocess.check_output(["id", "-un"], text=True).strip()
    nodes = [f"NodeName={name} NodeAddr={hosts.address(name)} CPUs={cpus} RealMemory=1000"
             + (f" Gres=gpu:{gpus}" if gpus else "") + " State=UNKNOWN" for name in computes]
    conf = base / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=hsmulti", f"SlurmctldHost={controller}({hosts.address(controller)})",
        f"SlurmUser={user}", f"SlurmdUser={user}", "SlurmctldPort=6817", "SlurmdPort=6818",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={'/tmp/munge' if munge_per_host else munge}/socket",
        f"StateSaveLocation={base}/state", f"SlurmdSpoolDir={base}/spool/%n",
        f"SlurmctldPidFile={base}/slurmctld.pid", f"SlurmdPidFile={base}/slurmd-%n.pid",
        f"SlurmctldLogFile={base}/log/slurmctld.log", f"SlurmdLogFile={base}/log/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none", "MpiDefault=none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "SchedulerType=sched/builtin",
        *(["GresTypes=gpu"] if gpus else []),
        "ReturnToService=2", "KillWait=10", "MinJobAge=600", f"FirstJobId={first_job}",
        "SlurmdTimeout=30", "InactiveLimit=0", "MessageTimeout=10",
        *nodes, f"PartitionName=hs Nodes={','.join(computes)} Default=YES MaxTime=INFINITE State=UP", "",
    ]))
    if gpus:
        # logical GPUs: files standing for devices (SLURM hands them out by index, CUDA_VISIBLE_DEVICES)
        (base / "dev").mkdir()
        for index in range(gpus):
            (base / "dev" / f"gpu{index}").touch()
        (base / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={base}/dev/gpu[0-{gpus - 1}]\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env}
    if munge_per_host:  # every host: SLURM's clients (a login host's sbatch) authenticate through theirs too
        for name, host in hosts.hosts.items():
            local = host.tmp / "munge"  # /tmp/munge on that host
            local.mkdir(mode=0o711)
            shutil.copyfile(munge / "key", local / "key")
            (local / "key").chmod(0o400)
            hosts.popen(name, ["munged", "--foreground", "--force", "--socket=/tmp/munge/socket",
                               "--key-file=/tmp/munge/key", "--pid-file=/tmp/munge/pid", "--seed-file=/tmp/munge/seed",
                               "--log-file=/tmp/munge/log"], **quiet)
        for name, host in hosts.hosts.items():
            until(lambda host=host: (host.tmp / "munge" / "socket").exists(), 30, f"munged did not start on {name}")
    else:
        hosts.popen(controller, ["munged", "--foreground", "--force", f"--socket={munge}/socket",
                                 f"--key-file={munge}/key", f"--pid-file={munge}/pid", f"--seed-file={munge}/seed",
                                 f"--log-file={munge}/log"], **quiet)
        until(lambda: (munge / "socket").exists(), 30, "munged did not start")
    hosts.popen(controller, ["slurmctld", "-D", "-f", str(conf)], **quiet)
    for name in computes:
        (base / "spool" / name).mkdir()
        hosts.popen(name, ["slurmd", "-D", "-f", str(conf)], **quiet)

    def idle() -> bool:
        shown = hosts.run(controller, ["sinfo", "-h", "-N", "-o", "%N %t"], env=env, timeout=30).stdout.split()
        return shown.count("idle") == len(computes)

    until(idle, 90, lambda: "the nodes did not come up:\n" + logs_tail(base / "log"))
    return env


def logs_tail(folder: Path, lines: int = 15) -> str:
    """The last lines of every log in ``folder`` (what a test that failed says about its daemons)."""
    said = []
    for path in sorted(folder.glob("*.log")):
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        said.append(f"--- {path.name}\n" + "\n".join(line[:300] for line in tail))
    return "\n".join(said) or f"(no logs in {folder})"


# --------------------------------------------------------------------------- services on a host

def start_postgres(hosts: Hosts, name: str, password: str, databases: tuple[str, ...] = ("headsweep", "mlflow"),
                   user: str = "headsweep") -> str:
    """A private PostgreSQL on host ``name`` as cluster.yaml sets the head's up: listening on its
    loopback and cluster address, password logins (scram) for ``user`` from the cluster's subnet only;
    its data in the host's local /tmp. Returns the server's address:port."""
    data, address = "/tmp/pgdata", hosts.address(name)
    done = hosts.run(name, pg_server.initdb(data), timeout=120)
    if done.returncode:
        raise RuntimeError(f"initdb: {done.stderr[-1500:]}")
    conf = hosts.hosts[name].tmp / "pgdata"
    with open(conf / "postgresql.conf", "a") as config:
        config.write(f"\nlisten_addresses = 'localhost,{address}'\nport = 5432\nunix_socket_directories = '/tmp'\n"
                     "fsync = off\npassword_encryption = 'scram-sha-256'\n")
    (conf / "pg_hba.conf").write_text(
        "local all postgres trust\nhost all postgres 127.0.0.1/32 trust\n"
        f"host all {user} {hosts.subnet}.0/24 scram-sha-256\n")
    done = hosts.run(name, pg_server.command("pg_ctl", "-D", data, "-l", "/tmp/pg.log", "-w", "-t", "60", "start"),
                     timeout=90)
    if done.returncode:
        raise RuntimeError(f"pg_ctl start: {done.stderr[-1500:]}\n{(hosts.hosts[name].tmp / 'pg.log').read_text()[-1500:]}")
    script = [f"CREATE USER {user} PASSWORD '{password}'"] + [f"CREATE DATABASE {db} OWNER {user}" for db in databases]
    for statement in script:
        done = hosts.run(name, [f"{pg_server.bin_dir()}/psql", "-h", "127.0.0.1", "-U", "postgres", "-c", statement], timeout=60)
        if done.returncode:
            raise RuntimeError(f"psql {statement.split(' PASSWORD')[0]}: {done.stderr[-500:]}")
    return f"{address}:5432"


def start_mlflow_server(hosts: Hosts, name: str, backend: str, env: dict[str, str], port: int = 5000) -> str:
    """``mlflow server`` on host ``name``'s cluster address: runs and metrics in ``backend``, artifacts
    proxied into the host's local /tmp (no other host sees that folder). Returns its URL."""
    import sys

    address = hosts.address(name)
    hosts.popen(name, [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend,
                       "--artifacts-destination", "/tmp/mlartifacts", "--host", address, "--port", str(port),
                       "--workers", "1", "--allowed-hosts", f"{address}:{port},{address}"],
                env=env | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},  # no Huey job consumers (as `headsweep ui`)
                cwd="/tmp", stdout=open(hosts.base / f"mlflow-{name}.log", "wb"), stderr=subprocess.STDOUT)
    url = f"http://{address}:{port}"
    probe = f"import urllib.request as u; print(u.urlopen('{url}/health', timeout=3).status)"

    def healthy() -> bool:
        return hosts.run(name, [sys.executable, "-c", probe], timeout=30).stdout.strip() == "200"

    until(healthy, 300, lambda: f"mlflow server did not start:\n{(hosts.base / f'mlflow-{name}.log').read_text()[-2000:]}")
    return url


def start_sshd(hosts: Hosts, names: list[str]) -> Path:
    """sshd on each of ``names`` (port 22 of its own address), as on machines reached over SSH: key
    logins as this user with a key made here (their home is the hosts' shared one, never this
    machine's). Returns the private key's path."""
    ssh = hosts.base / "ssh"
    ssh.mkdir(mode=0o700)
    for key in ("host", "user"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"headsweep-test-{key}",
                        "-f", str(ssh / key)], check=True)
    (ssh / "authorized_keys").write_text((ssh / "user.pub").read_text())
    (ssh / "sshd_config").write_text("\n".join([
        "Port 22", f"HostKey {ssh / 'host'}", f"AuthorizedKeysFile {ssh / 'authorized_keys'}",
        "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "PidFile /tmp/sshd.pid", "UseDNS no",
        "AcceptEnv LANG", "Subsystem sftp internal-sftp", ""]))
    privsep = Path("/run/sshd")  # sshd's privilege separation folder (Debian's service makes it)
    if not privsep.exists():  # made here: removed with the hosts (left if something was put in it meanwhile)
        privsep.mkdir()
        hosts.closing.append(privsep.rmdir)
    for name in names:
        hosts.popen(name, ["/usr/sbin/sshd", "-D", "-e", "-f", str(ssh / "sshd_config")],
                    stdout=open(hosts.base / f"sshd-{name}.log", "wb"), stderr=subprocess.STDOUT)
    for name in names:
        until(lambda name=name: any(port == 22 for _, port, _ in hosts.listening(name)), 30,
               lambda name=name: f"sshd did not start on {name}:\n{(hosts.base / f'sshd-{name}.log').read_text()}")
    return ssh / "user"


# --------------------------------------------------------------------------- a network filesystem between the hosts

SSHFS_OPTIONS = ("reconnect", "ServerAliveInterval=2", "ServerAliveCountMax=3", "ConnectTimeout=5")
"""sshfs's options on every client: a lost server is noticed after about 3 x 2 s of silence (its ssh
exits, sshfs answers what waited with an error), and each later access tries one new connection
within 5 s and fails, rather than hanging forever."""


def share_over_sshfs(hosts: Hosts, storage: str, clients: list[str], folder: Path | None = None,
                     key: Path | None = None, options: tuple[str, ...] = SSHFS_OPTIONS) -> Path:
    """A folder of host ``storage`` shared with ``clients`` over a real network filesystem, at the same
    path on every host, as a cluster shares one (opt-in: without it the hosts' shared folders are one
    kernel's, whose locks, page cache and ordering every host shares, which no network filesystem gives).

    ``storage`` keeps the folder on its disk (``folder``, by default ``hosts.base / "nfs"``) and serves
    it with sshd (``key``: the key :func:`start_sshd` returned there; started here when None); each
    client mounts it with sshfs (SFTP over SSH to the storage host's address, across the hosts'
    network) at that same path, in its own mount namespace only (this machine and the other hosts keep
    seeing the folder itself). Each mount is a FUSE filesystem of its own: a client's locks and page
    cache are its own, as with NFS or sshfs between machines. A cut client (:meth:`Hosts.cut`) loses
    the folder: what waits on it fails once ssh gives up (``options``: by default ``SSHFS_OPTIONS``;
    without them a read on a cut client blocks for as long as TCP keeps trying). :meth:`Hosts.close`
    unmounts (lazily, a cut host too) before it stops the hosts' processes, sshfs among them. Returns
    the folder."""
    lacking = [tool for tool in ("sshfs", "/usr/sbin/sshd", "ssh-keygen") if not shutil.which(tool)]
    if lacking or not Path("/dev/fuse").exists():
        raise RuntimeError(f"{', '.join(lacking) or '/dev/fuse'} not found: apt-get install sshfs openssh-server")
    folder = Path(folder or hosts.base / "nfs")
    folder.mkdir(parents=True, exist_ok=True)
    key = key or start_sshd(hosts, [storage])
    user = subprocess.check_output(["id", "-un"], text=True).strip()
    options = ",".join([*options, f"IdentityFile={key}", "BatchMode=yes", "StrictHostKeyChecking=no",
                        "UserKnownHostsFile=/dev/null", "LogLevel=ERROR"])
    for name in clients:
        log = hosts.base / f"sshfs-{name}.log"
        hosts.popen(name, ["sshfs", "-f", f"{user}@{hosts.address(storage)}:{folder}", str(folder), "-o", options],
                    stdin=subprocess.DEVNULL, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        hosts.closing.append(lambda name=name: unmount(hosts, name, folder))
    for name in clients:
        until(lambda name=name: mount_type(hosts, name, folder) == "fuse.sshfs", 30,
              lambda name=name: f"sshfs did not mount on {name}:\n{(hosts.base / f'sshfs-{name}.log').read_text()}")
    return folder


def mount_type(hosts: Hosts, name: str, path: Path | str, timeout: float = 10) -> str | None:
    """The type of the filesystem mounted last at ``path`` on host ``name`` (its /proc/self/mountinfo),
    e.g. ``fuse.sshfs``; None when nothing is mounted there."""
    done = hosts.run(name, ["cat", "/proc/self/mountinfo"], timeout=timeout)
    found = None
    for line in done.stdout.splitlines():
        fields, _, rest = line.partition(" - ")
        if fields.split()[4] == str(path):
            found = rest.split()[0]
    return found


def unmount(hosts: Hosts, name: str, path: Path | str) -> None:
    """Unmount ``path`` on host ``name`` lazily (``umount -l``: no wait on a server that is gone)."""
    hosts.run(name, ["umount", "-l", str(path)], timeout=20)


def clean_dead() -> list[str]:
    """Delete what a ``Hosts`` of a process that is gone left (its namespaces' processes killed, the
    namespaces deleted, its base removed): after a test run killed by a signal. Returns the namespaces."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    dead = sorted({name.split()[0] for name in listed if name.startswith("hs") and "-" in name.split()[0]
                   and name[2:].split("-")[0].isdigit() and not _alive_tag(int(name[2:].split("-")[0]))})
    for netns in dead:
        kill_pids(lambda netns=netns: {int(pid) for pid in subprocess.run(
            ["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()}, grace_s=2)
    for netns in dead:
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
    for netns in dead:
        for base in Path("/var/tmp").glob(f"hosts-{netns.split('-')[0]}-*"):
            shutil.rmtree(base, ignore_errors=True)
    return dead


def _alive_tag(tag: int) -> bool:
    """Whether a live process could own tag ``tag`` (PID % 50,000)."""
    def pytest(pid: str) -> bool:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            return b"pytest" in command or b"shared_fs_sqlite" in command  # a test, or tests/shared_fs_sqlite.py
        except OSError:  # gone meanwhile
            return False

    return any(int(pid) % 50_000 == tag and pytest(pid) for pid in os.listdir("/proc") if pid.isdigit())


if __name__ == "__main__":  # python tests/hosts.py: clean up after a killed test run
    print("deleted:", " ".join(clean_dead()) or "nothing")
