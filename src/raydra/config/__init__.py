"""What a run is asked to do, checked and typed: the schema's declarations (the one home of every
default) and their checks, the `_target_`s' arguments, the user's project, the keys raydra reads
itself, the run's spec handed to the workers, and the user's callbacks and loggers as the driver
prepares them.
"""
