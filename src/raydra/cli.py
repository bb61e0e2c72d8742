"""The `raydra` command: `raydra train [overrides]`, `raydra submit [overrides]`, `raydra compare PATH...`,
`raydra show RUN_DIR`, `raydra rerun RUN_DIR`.

`train` is `python train.py` for an installed raydra: the rest of its command line goes to Hydra
unchanged, and the training stack is imported only then. compare and show are offline and quick:
they read run directories only (see raydra.compare), on a disk or in storage (s3://bucket/prefix/...;
pyarrow is imported only then), and never import the training stack. Exit code 0 when at least one
run was shown, 1 when none, 2 for a usage error.
"""

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional

from raydra import compare as cmp
from raydra.compare.terminal import inert
from raydra.errors import unwritable


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raydra", description="Train runs; compare and inspect raydra run directories.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{train,submit,compare,show,rerun}")

    # Listed for `raydra --help` only: main() hands `raydra train ...` to Hydra before argparse
    # sees it, so that -m, --help, --cfg job and --config-dir mean what they mean to train.py.
    commands.add_parser(
        "train", help="train a run, a multirun (-m) or a Tune sweep: what python train.py does (raydra train --help)", add_help=False
    )
    # The same for `raydra submit`: its arguments are train's overrides.
    commands.add_parser(
        "submit", help="send a run or a multirun (-m) to SLURM as one batch job, then return (docs/slurm.md)", add_help=False
    )

    c = commands.add_parser(
        "compare",
        help="runs and sweeps side by side",
        description="One row per run: its tags, the chosen metrics (final and best), the config keys that differ, status, wall time and samples/s.",
        epilog="example: raydra compare outputs/sweeps/2026-11-22/14-10-00_vit_digits --metric val/acc --sort",
    )
    c.add_argument("paths", nargs="+", metavar="PATH", help="run directories, sweep directories or globs; or their storage URIs (s3://...)")
    c.add_argument("--metric", action="append", metavar="NAME", help="metric to show, repeatable (default: each run's monitor metric)")
    c.add_argument("--sort", action="store_true", help="order by the first metric, best first (by the monitor mode)")
    order = c.add_mutually_exclusive_group()
    order.add_argument("--desc", dest="descending", action="store_const", const=True, help="sort high to low")
    order.add_argument("--asc", dest="descending", action="store_const", const=False, help="sort low to high")
    c.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE", help="keep runs whose config KEY is VALUE, repeatable")
    c.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="TAG[,TAG]",
        help="keep runs tagged TAG (the config's top-level tags); repeated: runs with every one of them; TAG,TAG: runs with either",
    )
    c.add_argument(
        "--exclude-tag", action="append", default=[], metavar="TAG[,TAG]", help="leave out runs tagged TAG (any one of them), repeatable"
    )
    c.add_argument("--format", choices=sorted(cmp.RENDERERS), default="table", help="output format (default: table)")
    c.add_argument(
        "--group-by",
        action="append",
        metavar="KEY[,KEY]",
        help="one row per group of runs with mean ± sd and 95%% CI of each metric (default when runs differ by seed: every differing key but seed; none: one row per run)",
    )
    c.add_argument(
        "--baseline",
        metavar="GROUP",
        help="with groups: each group's difference to this one (KEY=VALUE[,KEY=VALUE] or its number), CI and Welch p-value",
    )
    c.add_argument("--plot", metavar="DIR", help="write one learning-curve PNG per metric into DIR")
    c.add_argument("--x", choices=("step", "epoch"), default="step", help="x axis of the curves (default: step)")
    c.add_argument("--html", metavar="FILE", help="write a self-contained HTML report (table, curves, configs)")
    c.add_argument(
        "--cost",
        action="store_true",
        help="add each run's worker-hours (GPU-hours), goodput and where its time went (summary.json's ledger); "
        "a sweep or multirun directory gets its own figures after the table",
    )
    c.add_argument(
        "--target",
        metavar="METRIC>=VALUE",
        help="with --cost (implied): each run's hours until the first epoch whose METRIC met VALUE (>=, <=, >, <), "
        "from metrics.csv; per group the mean over the seeds that reached it",
    )
    c.add_argument(
        "--price-per-hour", metavar="X", help=f"with --cost (implied): a cost column, hours x X (default: ${cmp.PRICE_ENV} when set)"
    )
    c.add_argument("--price-per-gpu-hour", metavar="X", help="the price of a GPU-hour, for runs whose ledger counts GPU-seconds")
    c.add_argument("--price-per-cpu-hour", metavar="Y", help="the price of a CPU worker-hour, for the other runs")
    c.set_defaults(func=run_compare)

    r = commands.add_parser(
        "rerun",
        help="run a recorded run again from its own config, into a new run directory",
        epilog="example: raydra rerun outputs/runs/2026-11-22/15-50-43_vit_digits trainer.max_epochs=1",
    )
    r.add_argument(
        "--trusted",
        action="store_true",
        help="run it even if it was not made on this machine: its config's _target_s are imported and run (docs/compare.md)",
    )
    r.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (its .hydra/config.yaml is the config)")
    r.add_argument("overrides", nargs=argparse.REMAINDER, metavar="OVERRIDE", help="key=value overrides on top of the recorded config")
    r.set_defaults(func=run_rerun)

    s = commands.add_parser("show", help="one run: config, overrides, status, metrics, files")
    s.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, or its storage URI (s3://...)")
    s.set_defaults(func=run_show)
    return parser


def report(notes: List[str], command: str) -> None:
    for note in dict.fromkeys(notes):  # the curves and the report may both notice the same file
        print(inert(f"raydra {command}: {note}"), file=sys.stderr)


def run_compare(args: argparse.Namespace) -> int:
    notes: List[str] = []
    try:
        costing = cmp.cost_options(
            args.cost, args.target, args.price_per_hour, args.price_per_gpu_hour, args.price_per_cpu_hour, os.environ
        )
        runs = cmp.collect(args.paths, args.filter, notes, args.tag, args.exclude_tag)
    except ValueError as error:  # a malformed --filter, --tag, --target or price
        report([*notes, str(error)], "compare")
        return 2
    if not runs:
        report([*notes, "no run to show."], "compare")
        return 1
    metrics = cmp.choose_metrics(runs, args.metric, notes)
    keys = cmp.differing_keys(runs)
    rows = cmp.build_table(runs, metrics, keys, notes, sort=args.sort, descending=args.descending)
    columns = cmp.table_columns(keys, metrics, tags=cmp.has_tags(runs))
    cost = cmp.cost_view(runs, costing, notes) if costing else None
    if cost is not None:
        columns += cost.add_columns(rows)
    try:
        grouped = cmp.aggregate(runs, keys, metrics, args.group_by, args.baseline, notes)
    except ValueError as error:  # a --baseline that names no group
        report([*notes, str(error)], "compare")
        return 2
    if grouped is not None and cost is not None:
        cost.add_group_columns(grouped, notes)
    if grouped is None:
        print(inert(cmp.RENDERERS[args.format](columns, rows, keys)))
    else:
        if args.format == "table":
            print(inert(grouped.heading))
        print(inert(cmp.render_groups(args.format, grouped.columns, grouped.rows)))
    # A seed race's verdict (race.json) after its runs' table; csv and json stay data alone.
    races = cmp.race_blocks(args.paths, notes) if args.format in ("table", "markdown") else []
    if races:
        print(inert("\n".join(races if args.format == "table" else ["", "```", *races[1:], "```"])))
    if cost is not None:
        cost.blocks = cmp.group_blocks(args.paths, costing.prices, notes)
        # Text for a reader after the table; csv and json stay data alone.
        legend = cost.legend(grouped is not None)
        if args.format == "table":
            print(inert("\n".join(["", *legend, *cost.blocks])))
        elif args.format == "markdown":
            blocks = ["", "```", *cost.blocks[1:], "```"] if cost.blocks else []
            print(inert("\n".join(["", *(f"- {line}" for line in legend), *blocks])))

    written = []
    try:
        if args.plot:
            where, what, flag = args.plot, "the plots", "--plot"
            written += cmp.write_plots(cmp.render_curves([run for run, _ in rows], metrics, keys, args.x, notes), args.plot)
        if args.html:
            where, what, flag = args.html, "the HTML report", "--html"
            title = "raydra compare: " + " ".join(args.paths)
            Path(args.html).parent.mkdir(parents=True, exist_ok=True)
            Path(args.html).write_text(cmp.render_html(rows, columns, keys, metrics, notes, title, grouped, cost), encoding="utf-8")
            written.append(Path(args.html))
    except OSError as error:
        refused = unwritable(
            error,
            error.filename or where,
            what,
            f"name a {'file' if flag == '--html' else 'directory'} in a directory you can write ({flag})",
        )
        if refused is None:
            raise
        report([*notes, str(refused)], "compare")
        return 1
    report(notes, "compare")
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return 0


def run_show(args: argparse.Namespace) -> int:
    notes: List[str] = []
    if cmp.is_uri(args.run_dir):
        # A run in storage: one listing says what is there, then only its record files are fetched.
        files, why = cmp.list_remote(args.run_dir, want="one run's directory")
        below = cmp.run_dirs_in(files or [])
        is_run, is_dir = below == [""], files is not None
    else:
        path = os.path.expanduser(args.run_dir)
        is_run, is_dir = cmp.is_run_dir(path), os.path.isdir(path)
        below, why = cmp.runs_below(path) if is_dir else [], "does not exist; pass the directory of one run"
    if not is_run:
        if below:
            why = f"is a sweep directory with {len(below)} runs; show one of them, or use: raydra compare {args.run_dir}"
        elif is_dir:
            why = "is not a run directory (no summary.json or .hydra/config.yaml); pass the directory of one run"
        report([f"{args.run_dir} {why}."], "show")
        return 1
    if cmp.is_uri(args.run_dir):
        loaded = cmp.load_remote_runs({args.run_dir: files}, notes)
        if not loaded:
            report(notes, "show")
            return 1
        run = loaded[args.run_dir]
    else:
        run = cmp.load_run(path, notes)
    print(inert(cmp.show_text(run, notes)))
    report(notes, "show")
    return 0


def project_on_path() -> None:
    """The current directory first on the import path, as `python train.py` or `python -m` has it:
    a researcher's package beside their conf/ imports without being installed or on PYTHONPATH
    (a local Ray's workers get the driver's directory from Ray; a cluster's, through ray.working_dir)."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def run_train(argv: List[str]) -> int:
    project_on_path()
    from raydra.entry import hydra_main

    # Hydra parses sys.argv itself; its usage lines name the command by argv[0].
    sys.argv = ["raydra train", *argv]
    hydra_main()
    return 0


def run_submit(argv: List[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        from raydra.slurm.submit import USAGE

        print(USAGE)
        return 0
    project_on_path()
    from raydra.slurm.submit import main as submit

    return submit(argv)


def run_rerun(args: argparse.Namespace) -> int:
    project_on_path()
    from raydra.rerun import rerun

    # `raydra rerun RUN_DIR --trusted`: argparse hands everything after RUN_DIR to the overrides.
    trusted = args.trusted or "--trusted" in args.overrides
    return rerun(args.run_dir, [o for o in args.overrides if o != "--trusted"], trusted)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:
        return run_train(argv[1:])
    if argv[:1] == ["submit"]:
        return run_submit(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        # `raydra compare ... | head`: the reader left; exit quietly instead of a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # python -m raydra.cli, as well as the raydra command
    sys.exit(main())
