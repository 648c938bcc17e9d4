"""test/slurm_cluster.py - a private single-node Slurm for the tests and the launcher benchmark:
munged, slurmctld and slurmd with their own key, socket, config, spool, state, logs and ports,
all in one temporary directory, so nothing of the machine's own Slurm (if any) is used or
touched. Debian's slurm-wlm and munge packages (tools/install_deps.sh installs them).

    with SlurmCluster(tmp, task_plugin="task/none") as slurm:   # raises SlurmUnavailable
        subprocess.run(["srun", "-n", "2", "--mpi=pmix", "./train_cpu", cfg], env=slurm.env())

The node gets the machine's CPUs; jobs may requeue (JobRequeue) and a requeued job may start
again 5 s after (cred_expire; Slurm's default is 120 s). task_plugin "task/none" leaves the
ranks of a step unbound (every rank may run on every core, as on a cluster whose Slurm binds
nothing), "task/affinity" binds each to its cores. The daemons run as root: slurmd must, to
start jobs as the submitting user (root here).
"""
import os
import shutil
import signal
import socket
import subprocess
import time


class SlurmUnavailable(Exception):
    """Why a private Slurm cannot start here (the test prints it on a SKIP line)."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(d, host, cpus, task_plugin):
    return f"""ClusterName=gpt5dtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock,cred_expire=5
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin={task_plugin}
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
InactiveLimit=0
KillWait=10
MinJobAge=300
JobRequeue=1
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    def __init__(self, tmp, task_plugin="task/none"):
        self.dir = os.path.join(tmp, "slurm")
        self.task_plugin = task_plugin
        self.conf = os.path.join(self.dir, "slurm.conf")

    def env(self, **extra):
        e = dict(os.environ, SLURM_CONF=self.conf)
        e.update(extra)
        return e

    def __enter__(self):
        why = self._missing()
        if why:
            raise SlurmUnavailable(why)
        try:
            self._start()
        except Exception:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def _missing(self):
        if os.geteuid() != 0:
            return "not root (slurmd must run as root to start jobs)"
        for tool in ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "sinfo"):
            if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
                return f"no {tool} (Debian: slurm-wlm, munge; make deps installs them)"
        return ""

    def _tool(self, name):
        return shutil.which(name) or f"/usr/sbin/{name}"

    def _start(self):
        d = self.dir
        for sub in ("", "state", "spool", "log"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        os.chmod(d, 0o755)  # munge wants its socket's directory reachable by everyone
        key = os.path.join(d, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        r = subprocess.run([self._tool("munged"), "--force", f"--socket={d}/munge.sock",
                            f"--key-file={key}", f"--log-file={d}/log/munged.log",
                            f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise SlurmUnavailable(f"munged did not start: {r.stderr.strip()[-300:]}")
        with open(self.conf, "w") as f:
            f.write(_config(d, socket.gethostname().split(".")[0], os.cpu_count(),
                            self.task_plugin))
        for daemon in ("slurmctld", "slurmd"):
            r = subprocess.run([self._tool(daemon)], env=self.env(), capture_output=True,
                               text=True, timeout=30)
            if r.returncode != 0:
                raise SlurmUnavailable(f"{daemon} did not start: {r.stderr.strip()[-300:]}")
        deadline = time.time() + 30
        while time.time() < deadline:
            r = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env(), capture_output=True,
                               text=True, timeout=30)
            if r.stdout.strip() == "idle":
                return
            time.sleep(0.3)
        raise SlurmUnavailable(f"the node never became idle: sinfo says {r.stdout.strip()!r} "
                               f"{r.stderr.strip()[-200:]} (logs in {d}/log)")

    def stop(self):
        """Cancels every job, then stops slurmd, slurmctld and munged (by their pid files)."""
        if os.path.exists(self.conf):
            subprocess.run(["scancel", "--full", "--user=root"], env=self.env(),
                           capture_output=True, timeout=30)
        for name in ("slurmd", "slurmctld", "munged"):
            pid_file = os.path.join(self.dir, name + ".pid")
            try:
                pid = int(open(pid_file).read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)

    def job_state(self, job_id):
        r = subprocess.run(["scontrol", "show", "job", str(job_id)], env=self.env(),
                           capture_output=True, text=True, timeout=30)
        fields = dict(f.split("=", 1) for f in r.stdout.split() if "=" in f)
        return fields.get("JobState", "UNKNOWN"), int(fields.get("Restarts", "0"))
