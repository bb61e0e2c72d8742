"""raydra: Hydra-composed experiments trained on Ray Train workers with Lightning."""

__version__ = "0.1.0"


def load(run_or_checkpoint, which="best", trusted=False):
    """The trained module of a run (its directory, a checkpoint.ckpt, or either's storage URI), for
    evaluation or inference: see raydra.records.checkpoints.load. `trusted`: what a run not your own may
    have built (False: a LightningModule with networks, optimizers, schedulers and partials from
    installed packages; a list of dotted names: those too; True: anything)."""
    # Imported on use: `raydra compare` must start without torch.
    from raydra.records.checkpoints import load as load_checkpoint

    return load_checkpoint(run_or_checkpoint, which, trusted)
