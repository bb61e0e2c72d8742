"""`tune=`: a Ray Tune search over runs, each trial the same fit as a single run.

    space.py    tune.space -> Tune domains, checked against the config before any trial starts
    trial.py    the trial: sampled values applied to the config, then a run's stages (raydra.run.sequence)
    tuner.py    the sweep's driver: Tuner or Tuner.restore, concurrency, signals, the sweep record
    report.py   every trial's final record, trials.csv/md, best_config.yaml, the console lines

    validate (space keys, distributions, sampled values) -> connect -> how many trials fit side by side
    -> Tuner(trial) or Tuner.restore(<sweep dir>/tune) -> settle every trial's summary.json
    -> trials table, best_config.yaml, best checkpoint, sweep.json

A trial is Tune's function trainable `trial.run_trial`: it applies its sampled values by dotted
key to the composed config (resolved again per trial, so keys interpolated from a sampled one follow it),
then walks a single run's stages (raydra.run.sequence: prepare, start, fit), whose fit launches the
TorchTrainer with ReportToTune. The sweep directory is the Hydra run directory of the invocation:

    <outputs>/sweeps/<date>/<time>_<name>/
      sweep.json             status (running / completed / failed / interrupted), metric, best trial
      trials.csv, trials.md  one row per trial: sampled values, metric, epochs, status, wall time
      best_config.yaml       the best trial's whole config: python train.py --config-path <dir> --config-name best_config
      best_checkpoint.ckpt   link to the best trial's best checkpoint
      trials/<trial id>/     one run directory per trial (.hydra/, summary.json, metrics.csv, checkpoints/, wandb/)
      tune/                  Ray Tune's experiment state, what tune.resume=<sweep dir> restores
      driver.log, logs/ray.log, .hydra/
"""

from raydra.sweep.tuner import run_sweep

__all__ = ["run_sweep"]
