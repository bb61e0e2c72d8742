"""raydra's config groups (model, data, strategy, scale, trainer, logger, callbacks, tune, experiment,
hydra) and the primary config, train.yaml: Hydra reads the YAML files; there is no code here.

This directory is the repository's top-level conf/ and ships inside raydra as the package
`raydra.conf` (pyproject.toml's package-dir), so that an installed wheel holds raydra/conf/ and an
editable install (`pip install -e .`) imports `raydra.conf` from here. This file makes it a package
for that editable install, whose import hook finds only packages with an `__init__.py`; Hydra skips
it when it lists the groups. Where raydra reads them from: raydra.entry.CONF_DIR.
"""
