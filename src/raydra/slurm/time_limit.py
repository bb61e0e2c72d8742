"""SLURM's warning before a job's time limit, taken as a preemption notice, and the requeue after it.

    sbatch --signal=B:USR1@<slurm.notice_before_s> --requeue      (raydra submit writes both)

    SIGUSR1 to the batch shell, which is raydra's process (`exec` in the script), then:
      a run's driver          every worker of its run gets SIGTERM, raydra's preemption notice
                              (worker/preemption.py): each saves a checkpoint at the step in flight
                              and stops; the run ends "interrupted"
      a multirun's launcher   passes the notice on to every running job's driver (each does the
                              above for its run) and starts no other job
      a Tune sweep            stops as Ctrl-C stops it (Tune saves its state; tune.resume= continues)
    as the process ends       `scontrol requeue <job>` (slurm.requeue) once the Ray cluster is
                              stopped: SLURM runs the batch script again, and the run (or the
                              multirun) continues where it stopped (raydra.run.driver, raydra.multirun.admission)

`watch` installs the handler as early as the command knows it runs on an allocation, so a notice
during start-up is noted rather than ending the process (SIGUSR1's default); what acts on it is
registered with `on_notice` around the part of the command that can act.
"""

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, Iterator, List

from raydra.slurm.allocation import JOB_ID

log = logging.getLogger("raydra")

NOTICE = signal.SIGUSR1
# How long a run's workers get, after their SIGTERM, to save and stop before the driver stops the
# run regardless (a checkpoint takes seconds; notice_before_s should leave room for it).
WORKERS_STOP_S = 90.0

_state: Dict[str, Any] = {"watched": False, "at": None, "action": None, "thread": None, "continues": False}
_lock = threading.Lock()


def watch() -> None:
    """From now on SIGUSR1 is SLURM's time-limit notice to this process. Main thread only."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(NOTICE, _on_notice)
        _state["watched"] = True


def watched() -> bool:
    """Whether this process takes SIGUSR1 as SLURM's time-limit notice."""
    return _state["watched"]


def noticed() -> bool:
    return _state["at"] is not None


def reason() -> str:
    """The run's status line when the notice stopped it."""
    job = os.environ.get(JOB_ID, "?")
    return f"interrupted: SLURM job {job}'s time limit is near (its notice, SIGUSR1); every worker checkpointed at the step in flight"


@contextlib.contextmanager
def on_notice(action: Callable[[], bool]) -> Iterator[None]:
    """While the block runs, the notice runs `action` in a thread of its own (at once if the notice
    came before). `action` returns whether the work it stopped continues after a requeue (a run's
    workers trained, a multirun had jobs running): only then is the job requeued."""
    with _lock:
        _state["action"] = action
        pending = noticed() and _state["thread"] is None
    if pending:
        _act()
    try:
        yield
    finally:
        with _lock:
            _state["action"] = None


def _on_notice(signum: int, frame: Any) -> None:
    if _state["at"] is not None:
        return  # SLURM warns once; a second signal changes nothing
    _state["at"] = time.time()
    log.warning(f"SLURM's time limit is near (SIGUSR1, SLURM job {os.environ.get(JOB_ID, '?')}): stopping at the step in flight")
    _act()


def _act() -> None:
    action = _state["action"]
    if action is None:
        return

    def run() -> None:
        try:
            _state["continues"] = bool(action())
        except Exception as error:  # noqa: BLE001 - the run's own handling still records it
            log.warning(f"acting on SLURM's time-limit notice failed: {error}")

    _state["thread"] = threading.Thread(target=run, name="raydra-time-limit", daemon=True)
    _state["thread"].start()


# ---------------------------------------------------------------------------------------------
# A run's driver: its workers checkpoint and stop


@contextlib.contextmanager
def run_stops_on_notice() -> Iterator[None]:
    """Around a run's fit on Ray: the notice sends each of the run's workers SIGTERM (they checkpoint
    at the step in flight and stop), waits until they are gone, then stops the fit unless it already
    ended: SIGTERM to this process, which the driver turns into a KeyboardInterrupt and records as
    interrupted (raydra.run.signals; not SIGINT, which Ray Train takes during a fit to abort the run its
    own way). The stop comes only while the block runs, so it never lands in the recording after."""
    fitting = {"on": True}

    def stop_workers() -> bool:
        stopped = signal_run_workers(signal.SIGTERM)
        if stopped:
            log.info(f"SIGTERM to the run's {len(stopped)} worker(s): each saves a checkpoint at the step in flight")
            _wait_gone(stopped, WORKERS_STOP_S)
        with _lock:
            if fitting["on"]:
                os.kill(os.getpid(), signal.SIGTERM)
        return bool(stopped)

    with on_notice(stop_workers):
        try:
            yield
        finally:
            with _lock:
                fitting["on"] = False
            # The fit can end first (Ray Train reports the SIGTERMed workers as failed) while the
            # notice's thread still asks Ray whether they are gone; the driver leaves Ray next, and a
            # Ray call after ray.shutdown ends the process before the requeue (seen in CI).
            thread = _state["thread"]
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=WORKERS_STOP_S + 30)


def signal_run_workers(signum: int) -> List[str]:
    """Send `signum` to every live Ray Train worker of this driver's runs, through a Ray task on
    each worker's node; returns their actor ids."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raydra.private_apis.ray_train import train_worker_actors

    workers = train_worker_actors(ray.get_runtime_context().get_job_id())
    by_node: Dict[str, List[int]] = {}
    for worker in workers:
        by_node.setdefault(worker["node_id"], []).append(int(worker["pid"]))
    kill = ray.remote(num_cpus=0, max_retries=0)(_send)
    sent = [
        kill.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(pids, signum)
        for node, pids in by_node.items()
    ]
    ray.get(sent, timeout=60)
    return [worker["actor_id"] for worker in workers]


def _send(pids: List[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _wait_gone(actor_ids: List[str], timeout: float) -> None:
    from ray.util.state import list_actors

    deadline = time.time() + timeout
    while time.time() < deadline:
        alive = {a.actor_id for a in list_actors(filters=[("state", "=", "ALIVE")], limit=10_000)}
        if not alive & set(actor_ids):
            return
        time.sleep(0.5)


# ---------------------------------------------------------------------------------------------
# The process that started Ray across the allocation: the requeue, last


def requeue_if_noticed(requeue: bool) -> None:
    """As the batch shell's process ends (its Ray cluster stopped): `scontrol requeue` this job if
    the notice stopped work that a requeue continues."""
    thread = _state["thread"]
    if thread is not None:
        thread.join(timeout=WORKERS_STOP_S + 30)
    if not noticed():
        return
    job = os.environ.get(JOB_ID)
    if not requeue:
        log.info(f"SLURM job {job} stopped at its time limit's notice; slurm.requeue=false: continue the run with resume=<its directory>")
        return
    if not _state["continues"]:
        log.warning(
            f"SLURM job {job} is not requeued: its time-limit notice came before anything trained in this attempt, so a requeue "
            "would only do the same again; ask for a longer slurm.time or a shorter slurm.notice_before_s."
        )
        return
    done = subprocess.run(["scontrol", "requeue", str(job)], capture_output=True, text=True)
    if done.returncode == 0:
        log.info(f"requeued SLURM job {job}: when SLURM starts it again, it continues from the checkpoint just saved")
    else:
        log.error(f"could not requeue SLURM job {job} (scontrol: {done.stderr.strip()}); continue the run with resume=<its directory>")
