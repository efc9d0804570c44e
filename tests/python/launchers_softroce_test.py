"""gradlane's Python ranks under the launchers that are not torchrun, over rxe: Open MPI's mpirun,
and Slurm's srun on a one-node cluster (munged, slurmctld and slurmd started here), each start a
server and two workers (one per emulated host, each given its host's device) that meet at a
rendezvous directory, with no torch imported; the workers fit a linear model in numpy through
gradlane.Worker. Checked: every rank knows its launcher and role, every push is applied, the loss
falls. Run by run_tests.py inside ci/softroce.sh --hosts 3 (GRADLANE_HOSTS)."""
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import socket
import tempfile
import time
import unittest

from emulated_hosts import hosts

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 20  # numpy_job.STEPS


def run_job(test, launcher_name, command, rank_variable, env_extra=None, timeout=240):
    """Runs numpy_job.py under `command` (the launcher's argv up to the program), each rank given
    its host's device by `rank_variable`, and checks what a user would."""
    devices = [device for device, _ in hosts()[:3]]
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(os.environ.get("GRADLANE_OUT_DIR", scratch), f"{launcher_name.split()[0].lower()}-job")
        os.makedirs(out, exist_ok=True)
        env = dict(os.environ, GRADLANE_RENDEZVOUS=f"file:{scratch}/rendezvous", GRADLANE_REPLICA="0",
                   GRADLANE_JOB_KEY=base64.b64encode(os.urandom(24)).decode(), **(env_extra or {}))
        # Each rank takes its host's device: one launcher node, ranks 0..2 on emulated hosts 0..2.
        rank_command = (f'set -- {" ".join(devices)}; shift "${rank_variable}"; '
                        f'GRADLANE_DEVICE="$1" exec {sys.executable} {HERE}/numpy_job.py {out}')
        try:
            done = subprocess.run(command + ["sh", "-c", rank_command], env=env, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as e:
            test.fail(f"{launcher_name} did not end in {timeout} s:\n{e.stdout}\n{e.stderr}")
        said = done.stdout + done.stderr
        test.assertEqual(done.returncode, 0, said)
        workers = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in (1, 2)]
    ended = re.search(r"server \(rank 0\) ended at version (\d+): (\d+) updates applied", said)
    test.assertIsNotNone(ended, said)
    test.assertEqual(int(ended.group(2)), 2 * STEPS, said)
    for id_, w in enumerate(workers, 1):
        test.assertEqual(w["launcher"], launcher_name)
        test.assertEqual(w["worker"], id_)
        test.assertFalse(w["imported_torch"], "the rendezvous is a directory: no torch needed")
        test.assertLess(w["losses"][-1], 0.5 * w["losses"][0], w["losses"])


class Mpirun(unittest.TestCase):
    def test_mpirun_starts_a_server_and_two_workers_that_train_without_torch(self):
        self.assertIsNotNone(shutil.which("mpirun"), "mpirun is missing: ci/install-deps.sh installs openmpi-bin")
        run_job(self, "Open MPI", ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3", "--mca", "btl",
                                   "self"], "OMPI_COMM_WORLD_RANK")


# A one-node Slurm cluster in a directory: munged on its own socket (root, hence --force), and
# slurmctld and slurmd reaching each other on 127.0.0.1 under this host's name.
SLURM_CONF = """ClusterName=gradlane
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.sock
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/linear
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
NodeName={host} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""


class Srun(unittest.TestCase):
    def test_srun_starts_a_server_and_two_workers_that_train_without_torch(self):
        for program in ("srun", "slurmctld", "slurmd", "munged"):
            self.assertIsNotNone(shutil.which(program), f"{program} is missing: ci/install-deps.sh installs Slurm")
        with tempfile.TemporaryDirectory() as cluster:
            for sub in ("state", "spool"):
                os.makedirs(os.path.join(cluster, sub))
            conf = os.path.join(cluster, "slurm.conf")
            with open(conf, "w") as f:
                f.write(SLURM_CONF.format(host=socket.gethostname(), dir=cluster))
            with open(os.path.join(cluster, "cgroup.conf"), "w") as f:  # no systemd in the VM to ask
                f.write("CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n")
            env = dict(os.environ, SLURM_CONF=conf)
            # slurmd sets its cgroup plugin up even to track processes without it; the emulated
            # hosts' VM mounts no cgroup file system.
            if not os.path.ismount("/sys/fs/cgroup"):
                done = subprocess.run(["mount", "-t", "cgroup2", "none", "/sys/fs/cgroup"], capture_output=True,
                                      text=True, timeout=30)
                self.assertEqual(done.returncode, 0, f"slurmd needs a cgroup file system: {done.stderr}")
                os.makedirs("/sys/fs/cgroup/system.slice", exist_ok=True)  # where systemd would put it
            started = [["munged", f"--socket={cluster}/munge.sock", "--key-file=/etc/munge/munge.key",
                        f"--pid-file={cluster}/munged.pid", f"--log-file={cluster}/munged.log",
                        f"--seed-file={cluster}/munge.seed", "--force"],
                       ["slurmctld", "-f", conf], ["slurmd", "-f", conf]]
            try:
                for daemon in started:
                    done = subprocess.run(daemon, env=env, capture_output=True, text=True, timeout=60)
                    log = os.path.join(cluster, f"{daemon[0]}.log")
                    said = open(log).read()[-2000:] if os.path.exists(log) else ""
                    self.assertEqual(done.returncode, 0, f"{daemon[0]}: {done.stdout}{done.stderr}{said}")
                deadline = time.monotonic() + 60
                while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                                                   text=True, timeout=30).stdout:
                    self.assertLess(time.monotonic(), deadline, "the Slurm node never came up idle: see "
                                    + open(os.path.join(cluster, "slurmd.log")).read()[-2000:])
                    time.sleep(0.5)
                run_job(self, "Slurm", ["srun", "-n", "3", "--overcommit"], "SLURM_PROCID", {"SLURM_CONF": conf})
            finally:
                stopped = []
                for name in ("slurmd", "slurmctld", "munged"):
                    try:
                        pid = int(open(os.path.join(cluster, f"{name}.pid")).read())
                        os.kill(pid, 15)
                        stopped.append(pid)
                    except (OSError, ValueError):
                        pass
                # They write their state and logs as they stop: the directory goes only after them.
                deadline = time.monotonic() + 20
                while any(alive(pid) for pid in stopped) and time.monotonic() < deadline:
                    time.sleep(0.1)


def alive(pid):
    """Whether process `pid` still runs (a zombie has stopped writing: not alive)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    unittest.main()
