"""Ray Tune's private API (raydra.private_apis says why such a module exists)."""

from typing import Any, Callable, List


def tune_stop_probe() -> Callable[[], bool]:
    """Inside a Tune function trial: a function that tells whether Tune has asked this trial to stop.

    Taken at the trial's start and held: when Tune stops a trial, it sets the session's stop event
    and drops the session in the same call, often before the trial's thread sees its fit end. Tune
    has no public "was I stopped" question for function trainables.
    """
    from ray.train._internal.session import get_session

    session = get_session()
    return lambda: session is not None and session.stop_event.is_set()


def replace_restored_tuner_callbacks(tuner: Any, callbacks: List[Any]) -> None:
    """A restored Tuner's RunConfig holds the interrupted driver's callbacks, unpickled; the new
    driver needs its own to see the trials. `Tuner.restore` takes no callbacks of its own."""
    tuner._local_tuner.get_run_config().callbacks = callbacks


def restored_tuner_scheduler(tuner: Any) -> Any:
    """The trial scheduler a restored Tuner will use; Tuner has no public accessor for it."""
    return tuner._local_tuner._tune_config.scheduler


def restore_scheduler_rungs(scheduler: Any, path: str) -> None:
    """Load a saved ASHA scheduler's rungs into `scheduler` while keeping its metric and mode.

    `Tuner.restore` brings back the scheduler as created, with no rungs; `TrialScheduler.restore`
    (public) would also bring back metric and mode, which Tune then refuses to set a second time.
    """
    kept = {k: v for k, v in vars(scheduler).items() if k in ("_metric", "_mode", "_metric_op")}
    scheduler.restore(path)
    vars(scheduler).update(kept)
