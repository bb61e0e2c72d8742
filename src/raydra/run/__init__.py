"""One run, from its composed config to its record: prepare and resolve, the lifecycle (Ray, stop
signals, a batch system's notice), the run sequence, the driver, the fit core around Ray Train's
TorchTrainer, resume, start-up, the hang watch, and what the record's values are built from. A single
run, each job of a multirun and each Tune trial walk the one sequence (raydra.run.sequence).
"""
