"""What reaches the console while Ray workers train.

Ray streams every worker's stdout/stderr to the driver with its own prefixes, deduplication
banners and controller notices. raydra takes that stream over: every line goes to the run's
logs/ray.log, and only the lines rank 0 marks as progress are shown, unless the run is verbose.

This hooks Ray's driver-side stream dispatcher, the one place all worker output passes through
(a private API: see raydra.private_apis).
"""

import logging
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional

from raydra.private_apis.ray import RAY_PRINT_LOGS_HANDLER, worker_stdstream_dispatcher
from raydra.records.layout import LOGS, RAY_LOG
from raydra.redact import redact, secret_values

# Rank 0 prefixes the lines meant for the researcher with this; the driver strips it.
PROGRESS_MARK = "[raydra] "

log = logging.getLogger("raydra")


class WorkerOutput:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._file: Optional[Any] = None
        self._secrets: List[str] = []
        # Verbose runs keep Ray's own printing, which already shows the progress lines.
        self.echo_progress = True

    def start_run(self, run_dir: Path) -> None:
        with self._lock:
            (run_dir / LOGS).mkdir(parents=True, exist_ok=True)
            self._file = open(run_dir / RAY_LOG, "a", buffering=1)
            # A worker may print what it was given (a config, a URI): masked as the driver's lines are.
            self._secrets = secret_values()

    def end_run(self) -> None:
        with self._lock:
            if self._file:
                self._file.close()
            self._file = None

    def __call__(self, data: Dict[str, Any]) -> None:
        source = f"({data.get('actor_name') or data.get('task_name') or 'worker'} pid={data.get('pid')})"
        with self._lock:
            for line in data.get("lines", []):
                line = redact(line, self._secrets)
                if self._file:
                    self._file.write(f"{source} {line}\n")
                if self.echo_progress and line.startswith(PROGRESS_MARK):
                    log.info(line[len(PROGRESS_MARK) :])


worker_output = WorkerOutput()


def take_over_worker_output(verbose: bool) -> None:
    """Route worker output through `worker_output`; verbose keeps Ray's own printing as well."""
    dispatcher = worker_stdstream_dispatcher()
    if not verbose:
        dispatcher.remove_handler(RAY_PRINT_LOGS_HANDLER)
    worker_output.echo_progress = not verbose
    dispatcher.add_handler("raydra", worker_output)
