"""`resume=<run dir>` / `resume=latest`: continue an interrupted or crashed run in its own directory.

The run keeps its run id, so Ray Train V2 (same RunConfig name + storage path) restores its
checkpoint manager and hands the workers the last checkpoint, W&B continues the same run, and
metrics.csv and summary.json are extended rather than replaced.

Hydra has already made a fresh directory for this invocation by the time the driver runs; the
driver trains in the old one and leaves the fresh one holding only this invocation's driver.log and
Hydra record (rewriting hydra.run.dir would need the run dir known before Hydra composes, which
`resume=latest` cannot know without composing `name` and `paths.outputs` first); a refused
`resume=` leaves its driver.log alone there (raydra.run.driver).
"""

from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml
from omegaconf import DictConfig, OmegaConf

from raydra import storage
from raydra.config.keys import flatten
from raydra.errors import RaydraError
from raydra.records import layout, metrics_csv, summary, trust
from raydra.records.envelope import Status
from raydra.redact import redact

# Keys that say how or where to run, not what is trained: changing them does not change the run.
NOT_THE_RUN = {"resume", "resume_force", "resume_trusted", "ray", "slurm", "verbose", "paths", "failure"}


def find(cfg: DictConfig) -> Path:
    """The run directory `cfg.resume` names, checked to be a raydra run that can be continued (check)."""
    if cfg.resume == "latest":
        # The newest run of this name that started training.
        root = Path(cfg.paths.outputs, "runs")
        # Runs that got as far as training: a config_hash is written once the config validated,
        # so invocations refused before that (a mistyped resume=, say) are not candidates.
        mine = [p.parent for p in root.glob("*/*/" + layout.SUMMARY) if _started(p.parent, cfg.name)]
        if not mine:
            raise RaydraError(f"resume=latest found no run named {cfg.name} under {root}; pass resume=<run dir>.")
        run_dir = max(mine, key=_start_time)
    elif storage.is_uri(cfg.resume):
        run_dir = _fetch(cfg)
    else:
        run_dir = Path(cfg.resume).expanduser().resolve()
    check(cfg, run_dir)
    return run_dir


def check(cfg: DictConfig, run_dir: Path) -> summary.RunRecord:
    """The record of the run in `run_dir`, checked to be one `cfg` can continue: a raydra run, made
    on this machine (or trusted), not completed, started with the same config (or resume_force),
    its metrics.csv readable. The driver checks once more with the run's lock held (driver._continue):
    a run it waited for may have completed meanwhile."""
    if not (run_dir / layout.SUMMARY).is_file() or not (run_dir / layout.CONFIG).is_file():
        raise RaydraError(
            f"resume={cfg.resume}: {run_dir} is not a raydra run directory (no summary.json and .hydra/config.yaml); "
            "pass a directory a raydra run wrote."
        )
    recorded = yaml.safe_load((run_dir / layout.CONFIG).read_text())
    if not cfg.get("resume_trusted") and not trust.made_here(run_dir):
        raise trust.refuse_foreign(run_dir, recorded, f"resume={cfg.resume}", "resume_trusted=true")
    previous = summary.read(run_dir)
    if previous.status == Status.COMPLETED:
        raise RaydraError(f"resume={cfg.resume}: {run_dir} already completed; start a new run instead of resuming it.")
    changes = changed_keys(recorded, cfg)
    if changes and not cfg.resume_force:
        raise RaydraError(
            f"resume={cfg.resume}: the config differs from the one {run_dir} started with ({'; '.join(changes)}); "
            "resume with the original settings, or add resume_force=true to continue with the new ones."
        )
    metrics = run_dir / layout.METRICS
    if metrics.is_file():
        # Read as the worker will (raydra.worker.loggers), before anything of the run is changed.
        try:
            metrics_csv.read(metrics)
        except RaydraError as error:
            raise RaydraError(f"resume={cfg.resume}: {error}") from None
    return previous


def of_slurm_job(cfg: DictConfig, job_id: str) -> Optional[Path]:
    """The run of this name that SLURM job `job_id` started before SLURM requeued it, if any: the
    run a requeued job continues (resume=latest's rule, narrowed to the job's own run)."""
    root = Path(cfg.paths.outputs, "runs")
    mine = [p.parent for p in root.glob("*/*/" + layout.SUMMARY) if _started(p.parent, cfg.name, job_id)]
    return max(mine, key=_start_time) if mine else None


def _fetch(cfg: DictConfig) -> Path:
    """resume=<storage URI>, from a driver that does not hold the run directory (a new machine):
    the record is copied from storage into the same place under paths.outputs; the checkpoints stay
    in storage, where Ray Train continues from them."""
    root, uri = cfg.paths.storage, cfg.resume
    relative = _below(uri, root) if root else None
    if relative is None:
        raise RaydraError(
            f"resume={uri} lies outside paths.storage={root}; set paths.storage to the storage the run was started "
            "with (the URI's prefix), so its checkpoints are found where Ray Train wrote them."
        )
    if not storage.exists(storage.join(uri, layout.SUMMARY)):
        raise RaydraError(f"resume={uri}: no summary.json there; pass the storage URI of a run directory a raydra run wrote.")
    run_dir = Path(cfg.paths.outputs, relative).resolve()
    storage.copy_tree(uri, str(run_dir), skip=[layout.CHECKPOINTS])
    return run_dir


def _below(location: str, root: str) -> Any:
    """`location`'s path relative to `root` (both URIs of one filesystem), or None if not below it."""
    try:
        fs_root, root_path = storage.filesystem(root)
        fs_here, path = storage.filesystem(location)
    except Exception:  # an unknown scheme: not below anything raydra can read
        return None
    if type(fs_root) is not type(fs_here) or not (path + "/").startswith(root_path.rstrip("/") + "/"):
        return None
    return path[len(root_path.rstrip("/")) + 1 :] or None


def changed_keys(old: Dict[str, Any], cfg: DictConfig) -> List[str]:
    """The keys whose values differ between a recorded (masked) config and `cfg`, as lines for an
    error message. `cfg` is masked the same way first: the record holds *** for a secret, so the
    secret itself would otherwise read as a change (and be printed in the refusal)."""
    new = redact(OmegaConf.to_container(cfg, resolve=False))
    before, after = flatten(old), flatten(new)
    return [
        f"{key}: {before.get(key, '<unset>')} -> {after.get(key, '<unset>')}"
        for key in sorted(set(before) | set(after))
        if key.split(".")[0] not in NOT_THE_RUN and before.get(key) != after.get(key)
    ]


def _started(run_dir: Path, name: str, slurm_job: Optional[str] = None) -> bool:
    run = summary.try_read(run_dir)
    if run is None:
        return False
    if slurm_job is not None and (run.slurm or {}).get("job_id") != slurm_job:
        return False
    return run.name == name and run.config_hash is not None


def _start_time(run_dir: Path) -> str:
    run = summary.try_read(run_dir)
    return (run.started_at if run else None) or ""
