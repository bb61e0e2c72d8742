"""LightningModules raydra ships, one per file; `model=<name>` picks one by its `_target_`."""
