"""Stand-ins for Slurm's `sbatch`, `srun`, `scontrol` and `sinfo` that run a batch script on
this machine as a one-node allocation: sbatch runs the script to its end (a real sbatch queues it
and returns), srun starts its tasks here with the variables Slurm gives them, and every call is
logged (one JSON line each) so a test can say what was launched how. And a `hostname` whose
addresses a test chooses (the node's /etc/hosts and interfaces)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SBATCH = r'''
import json, os, re, subprocess, sys, random, socket
args = sys.argv[1:]
script = args[-1]
with open(os.environ["SLURM_STANDIN_LOG"], "a") as f:
    f.write(json.dumps({"cmd": "sbatch", "args": args}) + "\n")
text = open(script).read()
job = str(random.randint(1, 19999))
out = re.search(r"^#SBATCH --output=(.*)$", text, re.M).group(1).replace("%j", job)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
env = {**os.environ, "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": "localhost",
       "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_CPUS_ON_NODE": "2",
       "MASTER_PORT": str(port)}
with open(out, "w") as log:
    done = subprocess.run(["bash", script], env=env, stdout=log, stderr=subprocess.STDOUT)
open(out + ".rc", "w").write(str(done.returncode))
print(job)
'''

SRUN = r'''
import json, os, signal, subprocess, sys
args = sys.argv[1:]
opts = {}
while args and args[0].startswith("-"):
    key, _, value = args.pop(0).partition("=")
    opts[key] = value
with open(os.environ["SLURM_STANDIN_LOG"], "a") as f:
    f.write(json.dumps({"cmd": "srun", "opts": opts, "args": args}) + "\n")
nodes = int(opts.get("--nodes", "1"))
if nodes != int(os.environ["SLURM_JOB_NUM_NODES"]):
    sys.exit(f"srun stand-in: --nodes={nodes} on a one-node allocation")
tasks = nodes * int(opts.get("--ntasks-per-node", "1"))
procs = [subprocess.Popen(args, env={**os.environ, "SLURM_NODEID": "0", "SLURM_PROCID": str(i),
                                     "SLURM_LOCALID": str(i), "SLURM_NNODES": str(nodes),
                                     "SLURM_NTASKS": str(tasks)})
         for i in range(tasks)]
def stop(signum, frame):
    for p in procs:
        p.send_signal(signum)
signal.signal(signal.SIGTERM, stop)
codes = [p.wait() for p in procs]
sys.exit(max(codes, key=abs))
'''

SCONTROL = r'''
import sys
assert sys.argv[1:3] == ["show", "hostnames"], sys.argv
print("localhost")
'''

SINFO = r'''
import json, os, sys
with open(os.environ["SLURM_STANDIN_LOG"], "a") as f:
    f.write(json.dumps({"cmd": "sinfo", "args": sys.argv[1:]}) + "\n")
print(os.environ["SINFO_GRES"])
'''


HOSTNAME = r'''
import os, sys
args = sys.argv[1:]
if not args:
    print("node1")
elif args[0] in ("-i", "--ip-address", "-I", "--all-ip-addresses"):
    print(os.environ["STANDIN_ADDRESSES"])  # what both would say on the node the test fakes
else:
    sys.exit(f"hostname stand-in: {args} not faked")
'''


def install_hostname(folder: Path, addresses: str) -> dict[str, str]:
    """A `hostname` first on PATH whose addresses are `addresses` (space-separated, in that
    order, for --ip-address and --all-ip-addresses alike: the node /etc/hosts and its
    interfaces describe); returns the environment that sets it up."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "hostname"
    path.write_text(f"#!{sys.executable}\n{HOSTNAME}")
    path.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "STANDIN_ADDRESSES": addresses}


def install(folder: Path) -> dict[str, str]:
    """Write the stand-ins into `folder`; return the environment that puts them first on PATH
    and logs their calls to folder/calls.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in (("sbatch", SBATCH), ("srun", SRUN), ("scontrol", SCONTROL),
                       ("sinfo", SINFO)):
        path = folder / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}",
            "SLURM_STANDIN_LOG": str(folder / "calls.jsonl")}


def calls(folder: Path) -> list[dict]:
    path = folder / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
