"""Imported first by the multirun jobs' server (raydra.multirun.job_process.PRELOAD), before Ray's modules:
the server forks every job, so a random generator it seeds is every job's, drawing the same
numbers. Ray's C++ one is seeded by the first id it draws, which importing Ray Train makes (an
actor class's id): the server has those ids drawn from the OS instead, and each job seeds Ray's
generator itself (raydra.private_apis.ray.draw_actor_class_ids_from_os). Python's own `random` reseeds
in a forked child by itself."""

from raydra.private_apis.ray import draw_actor_class_ids_from_os

draw_actor_class_ids_from_os()
