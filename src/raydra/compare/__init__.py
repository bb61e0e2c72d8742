"""`raydra compare` and `raydra show`: runs and sweeps side by side, from their run directories alone.

One module per concern, imports pointing down: in_storage (runs in storage listed, their record
files downloaded) <- discovery (which run directories the paths name) and recorded_run (a run's
record read into a RecordedRun) <- run_text (a record in words: status, hangs, files) and cost
(--cost: the ledger's hours, goodput and buckets, prices, hours to a target) <- cost_text (a
sweep's own figures, show's ledger lines) <- race_text (a seed race's verdict) <- selection (filters, tags, labels: collect) and table (metrics and config
columns, text formats) <- groups (seeds aggregated, differences to a baseline) and curves (which
plots, in which order; PNGs) <- report (the interactive HTML page); show (one run as text);
terminal (what is printed, its control characters escaped). None imports ray, torch, wandb or
hydra; matplotlib, plotly and scipy are imported only by the functions that need them."""

from raydra.compare.cost import PRICE_ENV, cost_options, cost_view
from raydra.compare.cost_text import group_blocks
from raydra.compare.curves import render_curves, write_plots
from raydra.compare.discovery import is_run_dir, run_dirs_in, runs_below
from raydra.compare.groups import aggregate, render_groups
from raydra.compare.in_storage import is_uri, list_remote
from raydra.compare.race_text import race_blocks
from raydra.compare.recorded_run import RecordedRun, config_source, load_remote_runs, load_run
from raydra.compare.report import render_html
from raydra.compare.selection import collect
from raydra.compare.show import show_text
from raydra.compare.table import RENDERERS, build_table, choose_metrics, differing_keys, has_tags, render_table, table_columns

__all__ = [
    "PRICE_ENV",
    "cost_options",
    "cost_view",
    "group_blocks",
    "aggregate",
    "render_groups",
    "race_blocks",
    "RENDERERS",
    "RecordedRun",
    "build_table",
    "choose_metrics",
    "collect",
    "config_source",
    "differing_keys",
    "has_tags",
    "is_run_dir",
    "is_uri",
    "list_remote",
    "load_remote_runs",
    "load_run",
    "render_curves",
    "render_html",
    "render_table",
    "run_dirs_in",
    "runs_below",
    "show_text",
    "table_columns",
    "write_plots",
]
