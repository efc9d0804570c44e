"""What the launcher said: rank, world size and where to meet, from torchrun, Slurm or Open MPI,
and the roles gradlane gives the ranks (rank 0 the server, then the replica if asked, then the
workers); the rendezvous is torch.distributed's TCPStore or FileStore, which every rank has."""
import hashlib
import os
import socket
import time
from dataclasses import dataclass

from . import Error

# (rank, world size, local rank) variables of each launcher, in the order they are looked for.
LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)
DEFAULT_PORT = 29400


def error(message, code="invalid_argument"):
    """A gradlane.Error raised from Python, with the .code and .errno the C++ ones carry."""
    e = Error(message)
    e.code, e.errno = code, 0
    return e


@dataclass(frozen=True)
class Launch:
    launcher: str
    rank: int
    world_size: int
    local_rank: int
    master_addr: str  # where rank 0 listens for the rendezvous
    master_port: int
    replica: bool  # rank 1 is the server's replica

    @property
    def first_worker(self):
        return 2 if self.replica else 1

    @property
    def workers(self):
        return self.world_size - self.first_worker

    @property
    def role(self):
        """'server', 'replica' or 'worker'."""
        return "server" if self.rank == 0 else "replica" if self.replica and self.rank == 1 else "worker"

    @property
    def worker_id(self):
        """1..workers for a worker (its id at the server), 0 otherwise."""
        return self.rank - self.first_worker + 1 if self.role == "worker" else 0


def _integer(env, name):
    text = env[name]
    try:
        return int(text)
    except ValueError:
        raise error(f"{name}={text!r} is not an integer: is the launcher's environment intact?") from None


def from_env(env=None, replica=None):
    """The Launch the environment describes. replica: True / False, or None to read
    GRADLANE_REPLICA (1 or 0; default 1 when there are at least 3 ranks)."""
    env = os.environ if env is None else env
    found = next((launcher for launcher in LAUNCHERS if launcher[1] in env and launcher[2] in env), None)
    if found is None:
        raise error("no launcher environment: start this under torchrun (RANK, WORLD_SIZE), mpirun (OMPI_COMM_WORLD_*) "
                    "or srun (SLURM_PROCID, SLURM_NTASKS), or set RANK and WORLD_SIZE yourself")
    name, rank_var, size_var, local_var = found
    rank, size = _integer(env, rank_var), _integer(env, size_var)
    local = _integer(env, local_var) if local_var in env else 0
    if not 0 <= rank < size:
        raise error(f"{rank_var}={rank} is outside 0..{size - 1} ({size_var}={size})")
    if replica is None:
        replica = env.get("GRADLANE_REPLICA", "1" if size >= 3 else "0") == "1"
    if size < (3 if replica else 2):
        raise error(f"{size} ranks: gradlane needs a server{', a replica' if replica else ''} and at least one "
                    f"worker ({3 if replica else 2} ranks){'; or GRADLANE_REPLICA=0' if replica else ''}")
    addr = env.get("MASTER_ADDR") or env.get("GRADLANE_MASTER_ADDR") or ""
    if not addr and not env.get("GRADLANE_RENDEZVOUS", "").startswith("file:"):
        raise error(f"{name} gave no MASTER_ADDR: set MASTER_ADDR (or GRADLANE_MASTER_ADDR) to rank 0's address, "
                    "or GRADLANE_RENDEZVOUS=file:DIR to a directory every rank sees")
    port = _integer(env, "MASTER_PORT") if "MASTER_PORT" in env else DEFAULT_PORT
    return Launch(name, rank, size, local, addr, port, replica)


class DirectoryStore:
    """The rendezvous as files in a directory every rank sees (GRADLANE_RENDEZVOUS=file:DIR): a key
    is a file written whole (a temporary file renamed), get() waits for it. Pure Python, so a job
    without torch (mpirun, srun) imports none. DIR must be new for each job: a key left by an
    earlier one would be read as this one's (name it after the job, e.g. $SLURM_JOB_ID)."""

    def __init__(self, path, timeout_s):
        self.path, self.timeout_s = path, timeout_s
        os.makedirs(path, exist_ok=True)

    def _file(self, key):
        return os.path.join(self.path, key.replace("%", "%25").replace("/", "%2F"))

    @staticmethod
    def _written_beside(path, value):
        """`value` written whole to a temporary file next to `path`; returns its name and bytes."""
        data = value.encode() if isinstance(value, str) else bytes(value)
        temporary = f"{path}.{os.getpid()}.partial"
        with open(temporary, "wb") as f:
            f.write(data)
        return temporary, data

    def set(self, key, value):
        temporary, _ = self._written_beside(self._file(key), value)
        os.replace(temporary, self._file(key))

    def compare_set(self, key, expected, desired):
        """As torch's TCPStore.compare_set: sets `desired` if the key holds `expected` ("" for absent)
        and returns what the key holds then. A new value appears whole (a file linked into place,
        which fails if one is there). To replace a value, a process first creates a token named
        after it, which one process alone can; the others wait for its value and return that."""
        path = self._file(key)
        wanted = expected.encode() if isinstance(expected, str) else bytes(expected)
        if wanted:
            held = self._read(path)
            if held != wanted:
                return held
            token = f"{path}.replacing.{hashlib.sha256(wanted).hexdigest()[:32]}"
            try:
                os.close(os.open(token, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            except FileExistsError:  # another process replaces this value: its value is the answer
                deadline = time.monotonic() + self.timeout_s
                while held == wanted and time.monotonic() < deadline:
                    time.sleep(0.01)
                    held = self._read(path)
                return held
            temporary, data = self._written_beside(path, desired)
            os.replace(temporary, path)
            return data
        temporary, data = self._written_beside(path, desired)
        try:
            os.link(temporary, path)
            return data
        except FileExistsError:
            return self._read(path)
        finally:
            os.unlink(temporary)

    @staticmethod
    def _read(path):
        """The key's value, b"" while it has none."""
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return b""

    def get(self, key):
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                with open(self._file(key), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise error(f"rendezvous: no rank published {key!r} in {self.path} within {self.timeout_s:.0f} s "
                                "(is the server rank running, and the directory shared by every rank?)",
                                "timeout") from None
                time.sleep(0.01)


def rendezvous(launch, timeout_s=120.0):
    """The key-value store the ranks meet at: torch's TCPStore hosted by rank 0 at MASTER_ADDR and
    MASTER_PORT + 1 (torchrun's own store keeps MASTER_PORT), or a DirectoryStore at
    GRADLANE_RENDEZVOUS=file:DIR (a directory every rank sees; no torch needed). This process's
    rank is claimed in it (claim_rank) before it is returned, so a rank launched twice stops here."""
    spec = os.environ.get("GRADLANE_RENDEZVOUS", "")
    if spec.startswith("file:"):
        store = DirectoryStore(spec[len("file:"):], timeout_s)
    elif spec:
        raise error(f"GRADLANE_RENDEZVOUS={spec!r}: give file:DIR, or leave it unset for a TCP store at MASTER_ADDR")
    else:
        import datetime

        import torch.distributed as dist

        store = dist.TCPStore(launch.master_addr, launch.master_port + 1, launch.world_size, launch.rank == 0,
                              datetime.timedelta(seconds=timeout_s))
    claim_rank(store, launch)
    return store


def _holder():
    """This process as a rank's holder: its host, pid and pid namespace (two containers may share
    a host name, and a pid means nothing outside its namespace)."""
    return f"{socket.gethostname()} pid {os.getpid()} ns {os.stat('/proc/self/ns/pid').st_ino}"


def _gone(holder):
    """Whether `holder` (as _holder() wrote it) is a process of this host and pid namespace that has
    exited; False when that cannot be known here."""
    host, _, pid, _, namespace = _holder().split(" ")
    theirs = holder.split(" ")
    if len(theirs) != 5 or (theirs[0], theirs[4]) != (host, namespace) or not theirs[2].isdigit():
        return False
    try:
        os.kill(int(theirs[2]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def claim_rank(store, job):
    """Takes job.rank for this process in the rendezvous, before it connects anywhere. A rank
    launched twice is refused here with a gradlane.Error naming the process that holds it: as a
    second worker under the same id it would supersede the one training at the server, and as a
    second server or replica it would start another job. A holder on this host whose process is
    gone (the rank crashed and was started again) is taken over."""
    key = f"gradlane/rank/{job.rank}"
    me = _holder()
    held = bytes(store.compare_set(key, "", me)).decode(errors="replace")
    if held != me and _gone(held):
        held = bytes(store.compare_set(key, held, me)).decode(errors="replace")
    if held == me:
        return
    raise error(f"rank {job.rank} ({job.role}) was launched twice: {held} holds it in this job's rendezvous; start "
                "each rank once per job (this process connected nowhere)")
