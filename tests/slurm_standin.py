"""Stand-in `srun` and `scontrol` for tests on a machine without Slurm: `write_standin_slurm`.

`srun` here does, on this one machine, what srun(1) does on a cluster for the options the console
uses (https://slurm.schedmd.com/srun.html): it takes `--nodes`, `--ntasks-per-node`, `--ntasks`,
`--gpus-per-node`, `--job-name` and `--exclusive` (as `--opt=value` or `--opt value`), refuses an
option it does not know and more nodes than the "cluster" has, then starts the command once per
task with the variables of the page's OUTPUT ENVIRONMENT VARIABLES that a task reads
(SLURM_JOB_ID, SLURM_STEP_ID, SLURM_NNODES, SLURM_NTASKS, SLURM_NODEID, SLURM_PROCID,
SLURM_LOCALID, SLURMD_NODENAME, SLURM_JOB_NODELIST, SLURM_STEP_NODELIST, SLURM_GPUS_PER_NODE,
...). Tasks are placed in block order, as srun's default distribution does: tasks 0..k-1 on the
first node. Their output comes back merged, whole lines, on srun's stdout and stderr. Its status
is, as the page's RETURN VALUE says, the highest exit code of all tasks, or 128 + the signal of a
task that a signal ended. A TERM or INT to srun is passed on to every task.

`scontrol show hostnames [LIST]` prints one node name per line of a hostlist (`gpu[01-03],x`),
by default of $SLURM_JOB_NODELIST, as scontrol(1) does.

The "nodes" are names of this machine (default `localhost` and `127.0.0.1`, which resolve here
everywhere), so a task on node 1 reaches a server started by the task on node 0. Each task
started is appended to `log` as one JSON line (node, ids, argv) for tests to read.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

_SRUN = r'''#!{python} -IS
import json
import os
import signal
import subprocess
import sys
import threading

NODES = {nodes!r}
JOB_ID = {job_id}
LOG = {log!r}
VALUED = {{"--nodes": "nodes", "-N": "nodes", "--ntasks-per-node": "per_node",
          "--ntasks": "ntasks", "-n": "ntasks", "--gpus-per-node": "gpus",
          "--job-name": "name", "-J": "name"}}
FLAGS = {{"--exclusive"}}


def fail(message):
    print("srun: error: " + message, file=sys.stderr, flush=True)
    sys.exit(1)


def options(argv):
    found, words = {{}}, list(argv)
    while words and words[0].startswith("-"):
        word = words.pop(0)
        name, has_value, value = word.partition("=")
        if name in FLAGS and not has_value:
            continue
        if name not in VALUED:
            print("srun: unrecognized option '%s'" % word, file=sys.stderr, flush=True)
            sys.exit(1)
        if not has_value:
            if not words:
                fail("option '%s' requires an argument" % name)
            value = words.pop(0)
        found[VALUED[name]] = value
    if not words:
        fail("no command to run")
    return found, words


def count(found, key, default):
    text = found.get(key)
    if text is None:
        return default
    if not text.isdigit() or int(text) < 1:
        fail("invalid %s value: %s" % (key, text))
    return int(text)


def main():
    found, command = options(sys.argv[1:])
    nodes = count(found, "nodes", 1)
    if nodes > len(NODES):
        fail("Unable to allocate resources: Requested node configuration is not available")
    per_node = count(found, "per_node", 0)
    ntasks = count(found, "ntasks", per_node * nodes if per_node else nodes)
    per_node = per_node or -(-ntasks // nodes)
    names = NODES[:nodes]
    placed = [(node, local) for node in range(nodes) for local in range(per_node)][:ntasks]
    common = {{
        "SLURM_JOB_ID": str(JOB_ID), "SLURM_JOBID": str(JOB_ID), "SLURM_STEP_ID": "0",
        "SLURM_JOB_NAME": found.get("name", os.path.basename(command[0])),
        "SLURM_NNODES": str(nodes), "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks),
        "SLURM_NTASKS_PER_NODE": str(per_node),
        "SLURM_TASKS_PER_NODE": tasks_per_node([node for node, _ in placed], nodes),
        "SLURM_JOB_NODELIST": ",".join(names), "SLURM_NODELIST": ",".join(names),
        "SLURM_STEP_NODELIST": ",".join(names), "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
    }}
    if "gpus" in found:
        common["SLURM_GPUS_PER_NODE"] = found["gpus"]
    lock = threading.Lock()
    tasks, pumps = [], []
    for procid, (node, local) in enumerate(placed):
        env = dict(os.environ, **common, SLURM_NODEID=str(node), SLURM_PROCID=str(procid),
                   SLURM_LOCALID=str(local), SLURMD_NODENAME=names[node])
        with open(LOG, "a") as log:
            log.write(json.dumps({{"node": names[node], "nodeid": node, "procid": procid,
                                  "localid": local, "argv": command}}) + "\n")
        try:
            task = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        except OSError as error:
            fail("%s: %s" % (command[0], error.strerror))
        tasks.append(task)
        for source, sink in ((task.stdout, sys.stdout), (task.stderr, sys.stderr)):
            pump = threading.Thread(target=copy, args=(source, sink, lock), daemon=True)
            pump.start()
            pumps.append(pump)

    def forward(signum, _frame):
        for task in tasks:
            if task.poll() is None:
                task.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [task.wait() for task in tasks]
    for pump in pumps:
        pump.join()
    sys.exit(max(128 - code if code < 0 else code for code in codes))


def tasks_per_node(nodes_of_tasks, nodes):
    """Slurm's form: runs of equal counts as `COUNT(xRUN)`, e.g. `2(x3),1`."""
    counts = [nodes_of_tasks.count(node) for node in range(nodes)]
    runs = []
    for value in counts:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return ",".join(str(c) if n == 1 else "%d(x%d)" % (c, n) for c, n in runs)


def copy(source, sink, lock):
    for line in iter(source.readline, b""):
        with lock:
            sink.buffer.write(line)
            sink.buffer.flush()


main()
'''

_SCONTROL = r"""#!{python} -IS
import os
import re
import sys


def expand(hostlist):
    names = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", hostlist):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            for number in range(int(low), int(high or low) + 1):
                names.append(prefix + str(number).zfill(len(low)))
    return names


words = sys.argv[1:]
if words[:2] != ["show", "hostnames"]:
    print("scontrol: this stand-in knows only `show hostnames`", file=sys.stderr)
    sys.exit(1)
hostlist = words[2] if len(words) > 2 else os.environ.get("SLURM_JOB_NODELIST", "")
for name in expand(hostlist):
    print(name)
"""


def write_standin_slurm(
    directory: Path,
    *,
    nodes: Sequence[str] = ("localhost", "127.0.0.1"),
    job_id: int = 4242,
    log: Path | None = None,
) -> Path:
    """Write executable ``directory/srun`` and ``directory/scontrol`` run by this Python; returns
    the log of tasks started (``log``, else ``directory/srun-tasks.jsonl``)."""
    log = log or directory / "srun-tasks.jsonl"
    values = {"python": sys.executable, "nodes": tuple(nodes), "job_id": job_id, "log": str(log)}
    for name, script in (("srun", _SRUN), ("scontrol", _SCONTROL)):
        path = directory / name
        path.write_text(script.format(**values))
        path.chmod(0o755)
    return log
