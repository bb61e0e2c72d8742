"""Hydra's launcher conformance suites (hydra/test_utils/launcher_common_tests.py) against
`hydra/launcher=raydra`, subclassed as Hydra's joblib, Ray and submitit launcher plugins subclass
them in their own tests.

Not collected by itself (its name does not start with test_): test_launcher_contract.py runs it in
a pytest process of its own whose environment names the session's Ray cluster (RAY_ADDRESS, Ray's
rule for an address left null, and the cluster's token), which Ray reads as it is imported. The
suites' apps are not raydra runs, so every job is a Ray task on that cluster.
"""

from hydra.test_utils.launcher_common_tests import BatchedSweeperTestSuite, IntegrationTestSuite, LauncherTestSuite
from pytest import mark


@mark.parametrize("launcher_name, overrides", [("raydra", [])])
class TestRaydraLauncher(LauncherTestSuite):
    pass


@mark.parametrize("launcher_name, overrides", [("raydra", ["hydra/sweeper=basic", "hydra.sweeper.max_batch_size=2"])])
class TestRaydraLauncherBatchedSweeper(BatchedSweeperTestSuite):
    pass


@mark.parametrize("task_launcher_cfg, extra_flags", [({}, ["-m", "hydra/launcher=raydra"])])
class TestRaydraLauncherIntegration(IntegrationTestSuite):
    pass
