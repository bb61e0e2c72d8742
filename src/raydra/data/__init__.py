"""LightningDataModules raydra ships, one per file; `data=<name>` picks one by its `_target_`."""
