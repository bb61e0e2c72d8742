"""Hydra's private API (raydra.private_apis says why such a module exists)."""


def report_as_hydra_does(error: BaseException) -> None:
    """Hydra's own report of an error that reached its main (a message for its own errors, a
    trimmed traceback for others), then exit 1, as `@hydra.main` does when it catches the error
    itself. raydra's entry has Hydra raise instead (HYDRA_FULL_ERROR), to say the errors a user can
    fix in one sentence; the rest go back to Hydra's reporter, which no public API exposes."""
    from hydra._internal.utils import run_and_report

    def raise_it() -> None:
        raise error

    run_and_report(raise_it)
