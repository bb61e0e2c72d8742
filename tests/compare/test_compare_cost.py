"""`raydra compare --cost` and `raydra show`'s ledger on hand-made run directories whose ledgers
and metrics.csv are known (tests/helpers.make_run, its summary.json rewritten through
raydra.records.summary with a Ledger), so every figure is checked against a hand calculation.
Fast: no Ray, no training."""

import dataclasses
import json
import re

import pytest
from helpers import compare, make_run

from raydra.cli import main
from raydra.records import jobs, summary, sweep
from raydra.records.ledger import GroupLedger, Ledger, Restart

# Four runs, two learning rates x two seeds, val/acc by epoch (4 epochs each). With --target
# val/acc>=0.9: a reaches it at its 2nd epoch, b never, c at its 1st, d at its 2nd (d's record is
# older than the ledger: no hours).
A = Ledger(
    workers=2,
    gpu=False,
    wall_s=1800,
    allocated_s=3600,
    buckets={"startup": 360, "productive": 2520, "validation": 360, "data_wait": 180, "checkpoint_save": 180, "other": 0},
)
B = Ledger(
    workers=2,
    gpu=False,
    wall_s=3600,
    allocated_s=7200,
    buckets={"startup": 720, "productive": 3600, "lost": 1800, "restart": 720, "other": 360},
    restarts=[Restart(attempt=1, from_step=40, reached_step=65, lost_s=1800, restart_s=720)],
)
C = Ledger(workers=4, gpu=False, wall_s=900, allocated_s=3600, buckets={"startup": 720, "productive": 2880})
RUNS = {
    "a": (0.01, 0, (0.5, 0.92, 0.93, 0.95), A),
    "b": (0.01, 1, (0.5, 0.6, 0.8, 0.85), B),
    "c": (0.1, 0, (0.91, 0.95, 0.96, 0.97), C),
    "d": (0.1, 1, (0.5, 0.95, 0.96, 0.97), None),
}
SWEEP_LEDGER = GroupLedger(
    runs=4,
    slots=4,
    wall_s=3600,
    allocated_s=14400,
    runs_s=12600,
    buckets={"productive": 9000},
    idle_s=1800,
    not_completed_s={"failed": 7200},
    best="c",
    best_s=3600,
    gpu=False,
)


def with_ledger(run, ledger, **fields):
    """The run's summary.json rewritten through the typed record, with `ledger` and `fields`."""
    record = summary.read(run)
    summary.write(run, dataclasses.replace(record, ledger=ledger, **fields))
    return run


@pytest.fixture
def costed(tmp_path):
    root = tmp_path / "sweeps" / "2026-11-22" / "15-20-01_vit_digits"
    for job, (lr, seed, accs, ledger) in RUNS.items():
        run = make_run(root, job, lr=lr, seed=seed, accs=accs, epochs=4)
        if ledger is not None:
            with_ledger(run, ledger, epochs_completed=4)
    sweep.write(root, sweep.SweepRecord(status="completed", name="vit_digits", ledger=SWEEP_LEDGER))
    return root


def as_json(capsys, *args):
    code, out, err = compare(capsys, *args, "--format", "json")
    assert code == 0, err
    return json.loads(out), err


def test_cost_shows_each_runs_hours_goodput_and_bucket_shares_and_blank_cells_without_a_ledger(costed, capsys):
    """Per run: worker-hours, goodput and the share of each bucket some run used, in json, the table,
    markdown and csv; a record from before the ledger has every cost cell blank."""
    records, err = as_json(capsys, costed, "--cost", "--group-by", "none")
    assert err == ""
    cost_columns = list(records[0])[list(records[0]).index("samples/s") + 1 : -2]
    # Every bucket with seconds in some run, in the ledger's order; productive is the goodput.
    assert cost_columns == [
        "worker-h",
        "goodput",
        "% startup",
        "% validation",
        "% data_wait",
        "% checkpoint_save",
        "% lost",
        "% restart",
        "% other",
    ]
    a, b, c, d = records
    assert [r["worker-h"] for r in records] == [1.0, 2.0, 1.0, None]
    assert [r["goodput"] for r in records[:3]] == pytest.approx([0.7, 0.5, 0.8]) and d["goodput"] is None
    assert (a["% startup"], a["% validation"], a["% data_wait"], a["% lost"]) == pytest.approx((0.1, 0.1, 0.05, 0.0))
    assert (b["% lost"], b["% restart"], b["% other"], c["% startup"]) == pytest.approx((0.25, 0.1, 0.05, 0.2))
    # The record from before the ledger: every cost cell blank.
    assert all(d[column] is None for column in cost_columns)
    assert "cost" not in a  # no price, no money

    code, out, err = compare(capsys, costed, "--cost", "--group-by", "none")
    assert code == 0 and err == ""
    header, _, *lines = out.splitlines()[:6]
    assert re.split(r"\s{2,}", header)[8:] == ["worker-h", "goodput", *cost_columns[2:]]
    assert lines[1].split()[8:] == ["2", "50%", "10%", "0%", "0%", "0%", "25%", "10%", "5%"]
    assert lines[3].split() == ["d", "0.97", "0.97", "1", "0.1", "completed", "71.3", "812.4"]  # its cost cells blank
    assert "worker-h: worker-hours, workers x wall time (summary.json's ledger); blank: a record from before raydra kept a ledger" in out
    assert "cost:" not in out

    code, out, _ = compare(capsys, costed, "--cost", "--group-by", "none", "--format", "markdown", "--price-per-hour", "2")
    header = out.splitlines()[0]
    assert "| worker-h | goodput | % startup |" in header and header.endswith("| cost |")
    assert out.splitlines()[2].endswith("| 1 | 70% | 10% | 10% | 5% | 5% | 0% | 0% | 0% | 2.00 |")
    code, out, _ = compare(capsys, costed, "--cost", "--group-by", "none", "--format", "csv")
    header, a, *_ = out.splitlines()
    assert header.endswith("worker-h,goodput,% startup,% validation,% data_wait,% checkpoint_save,% lost,% restart,% other,run_dir")
    assert a.split(",")[-10:-1] == ["1.0", "0.7", "0.1", "0.1", "0.05", "0.05", "0.0", "0.0", "0.0"]


def test_a_seed_group_sums_its_hours_and_weighs_its_goodput_by_them(costed, capsys):
    """A seed group: its runs' hours summed, goodput weighted by their hours."""
    groups, err = as_json(capsys, costed, "--cost")
    assert [g["group"] for g in groups] == ["model.optimizer.lr=0.01", "model.optimizer.lr=0.1"]
    first, second = groups
    assert first["worker-h"] == 3.0 and first["goodput"] == pytest.approx((2520 + 3600) / (3600 + 7200))
    # d has no ledger: the group's hours are c's alone, and a line says so.
    assert second["worker-h"] == 1.0 and second["goodput"] == pytest.approx(0.8)
    assert "group model.optimizer.lr=0.1: 1 of its 2 runs has no ledger" in err

    code, out, _ = compare(capsys, costed, "--cost")
    heading, header, _, one, two, *rest = out.splitlines()
    assert header.split()[-2:] == ["worker-h", "goodput"]
    assert one.split()[-2:] == ["3", "57%"] and two.split()[-2:] == ["1", "80%"]
    assert (
        "worker-h: worker-hours, workers x wall time (summary.json's ledger); blank: a record from before raydra kept a ledger; a group: its runs' sum"
        in rest
    )
    assert "goodput: productive / allocated, a group's weighted by its runs' hours" in rest


def test_hours_to_a_target_per_run_and_config_and_a_malformed_target_in_one_sentence(costed, capsys):
    """--target: per run the epochs and hours until the metric first met it, per group the mean over
    the seeds that reached it and how many did; a malformed one refused in one sentence."""
    records, _ = as_json(capsys, costed, "--target", "val/acc>=0.9", "--group-by", "none")
    epochs = [r["val/acc>=0.9 epochs"] for r in records]
    assert epochs == [2, "not reached", 1, 2]
    # a: its start-up, and the rest for 2 of its 4 epochs; b: not reached, all its hours; c: 1 of 4.
    hours = [r["val/acc>=0.9 worker-h"] for r in records]
    assert hours[:3] == pytest.approx([(360 + 3240 * 2 / 4) / 3600, 2.0, (720 + 2880 / 4) / 3600]) and hours[3] is None

    groups, _ = as_json(capsys, costed, "--target", "val/acc>=0.9")
    assert [g["val/acc>=0.9 reached"] for g in groups] == [{"reached": 1, "runs": 2}, {"reached": 2, "runs": 2}]
    # The mean over the seeds that reached it (and have hours): a alone; c alone (d has no ledger).
    assert [g["val/acc>=0.9 worker-h"] for g in groups] == pytest.approx([0.55, 0.4])
    code, out, _ = compare(capsys, costed, "--target", "val/acc>=0.9")
    assert out.splitlines()[3].split()[-4:] == ["3", "57%", "0.55", "1/2"]
    assert (
        "val/acc>=0.9 worker-h: start-up, plus the rest x the epochs until val/acc met it / the epochs trained "
        "(an attribution, not a measurement); not reached: all its hours; a group: the mean over its runs that reached it"
    ) in out.splitlines()

    # Lower is better: val/loss (1 - val/acc) at most 0.05; a meets it in its last epoch, all its hours.
    records, _ = as_json(capsys, costed, "--target", "val/loss<=0.05", "--group-by", "none")
    assert [r["val/loss<=0.05 epochs"] for r in records] == [4, "not reached", 2, 2]
    assert records[0]["val/loss<=0.05 worker-h"] == pytest.approx(1.0)

    # A target that is no comparison with a number is refused in one sentence, with an example.
    for target, said in [
        ("val/acc", "--target 'val/acc' is not METRIC>=VALUE; write it like --target 'val/acc>=0.9' (or <=, >, <)."),
        ("val/acc=0.9", "--target 'val/acc=0.9' is not METRIC>=VALUE; write it like --target 'val/acc>=0.9' (or <=, >, <)."),
        (">=0.9", "--target '>=0.9' is not METRIC>=VALUE; write it like --target 'val/acc>=0.9' (or <=, >, <)."),
        (
            "val/acc>=high",
            "--target 'val/acc>=high' compares val/acc with 'high', which is not a number; write it like --target 'val/acc>=0.9' (or <=, >, <).",
        ),
    ]:
        code, out, err = compare(capsys, costed, "--target", target)
        assert code == 2 and out == "" and err == f"raydra compare: {said}\n"


def test_a_money_column_only_with_a_price_from_a_flag_the_environment_or_the_run(costed, tmp_path, capsys, monkeypatch):
    """A cost column only with a price: one price, RAYDRA_PRICE_PER_HOUR as its default (which alone
    asks for no cost), or a GPU-hour's and a CPU worker-hour's, by each run's ledger."""
    monkeypatch.delenv("RAYDRA_PRICE_PER_HOUR", raising=False)
    records, _ = as_json(capsys, costed, "--price-per-hour", "2.5", "--group-by", "none")
    assert [r["cost"] for r in records] == [2.5, 5.0, 2.5, None]
    groups, _ = as_json(capsys, costed, "--price-per-hour", "2.5")
    assert [g["cost"] for g in groups] == [7.5, 2.5]
    code, out, _ = compare(capsys, costed, "--cost", "--price-per-hour", "2.5")
    assert "cost: hours x 2.5 per hour (--price-per-hour)" in out.splitlines()
    assert out.splitlines()[-5:] == [
        "  held           4 worker-h (4 slots x 3600 s); cost 10.00",
        "  runs           3.5 worker-h, goodput 62%; cost 8.75",
        "  idle slots     0.5 worker-h, 12% of held; cost 1.25",
        "  not completed  2 worker-h (failed 2); cost 5.00",
        "  best run       1 worker-h (c, alone); cost 2.50",
    ]

    # The environment's price is --price-per-hour's default; it alone asks for no cost.
    monkeypatch.setenv("RAYDRA_PRICE_PER_HOUR", "3")
    records, _ = as_json(capsys, costed, "--group-by", "none")
    assert "cost" not in records[0] and "worker-h" not in records[0]
    records, _ = as_json(capsys, costed, "--cost", "--group-by", "none")
    assert [r["cost"] for r in records] == [3.0, 6.0, 3.0, None]
    monkeypatch.setenv("RAYDRA_PRICE_PER_HOUR", "cheap")
    code, _, err = compare(capsys, costed, "--cost")
    assert code == 2
    assert (
        err
        == "raydra compare: RAYDRA_PRICE_PER_HOUR='cheap' is not a price; set it like RAYDRA_PRICE_PER_HOUR=2.5 (what an hour costs), or unset it.\n"
    )
    monkeypatch.delenv("RAYDRA_PRICE_PER_HOUR")
    code, _, err = compare(capsys, costed, "--price-per-gpu-hour", "-1")
    assert (
        code == 2
        and err
        == "raydra compare: --price-per-gpu-hour '-1' is not a price; write it like --price-per-gpu-hour 2.5 (what an hour costs, in any currency).\n"
    )

    # One price for GPU-hours, another for CPU worker-hours: each run's ledger picks.
    root = tmp_path / "runs"
    with_ledger(make_run(root, "gpu", lr=0.01), dataclasses.replace(C, gpu=True))
    with_ledger(make_run(root, "cpu", lr=0.1), C)
    records, _ = as_json(capsys, root, "--price-per-gpu-hour", "4", "--price-per-cpu-hour", "0.5")
    # GPU-hours and CPU worker-hours in one column, each run saying which.
    assert [(r["run"], r["hours"], r["hours on"], r["cost"]) for r in records] == [("cpu", 1.0, "CPU", 0.5), ("gpu", 1.0, "GPU", 4.0)]
    records, _ = as_json(capsys, root / "gpu", "--cost")
    assert records[0]["GPU-h"] == 1.0

    # A run that recorded its price (ledger.price_per_hour) is priced without a flag; a flag wins.
    with_ledger(make_run(tmp_path / "priced", "own", lr=0.1), dataclasses.replace(C, price_per_hour=2.0))
    records, _ = as_json(capsys, tmp_path / "priced", "--cost")
    assert records[0]["cost"] == 2.0
    records, _ = as_json(capsys, tmp_path / "priced", "--price-per-hour", "3")
    assert records[0]["cost"] == 3.0


def test_a_sweeps_and_a_multiruns_own_figures_follow_the_table(costed, tmp_path, capsys):
    """A sweep's (sweep.json) or multirun's (jobs.json) own figures after the table."""
    code, out, err = compare(capsys, costed, "--cost")
    assert code == 0
    block = out[out.index("sweep.json of") :].splitlines()
    assert block == [
        f"sweep.json of {costed}: 4 runs on 4 slots, 3600 s wall",
        "  held           4 worker-h (4 slots x 3600 s)",
        "  runs           3.5 worker-h, goodput 62%",
        "  idle slots     0.5 worker-h, 12% of held",
        "  not completed  2 worker-h (failed 2)",
        "  best run       1 worker-h (c, alone)",
    ]
    # csv and json are the runs' data alone.
    code, out, _ = compare(capsys, costed, "--cost", "--format", "csv")
    assert "sweep.json" not in out

    # A multirun whose jobs.json was written before the ledger says so; its runs still show.
    multirun = tmp_path / "multirun"
    make_run(multirun, "0")
    jobs.write(multirun, jobs.JobsRecord(status="completed"))
    code, out, _ = compare(capsys, multirun, "--cost")
    assert code == 0 and out.rstrip().endswith(f"jobs.json of {multirun}: no ledger (written before raydra kept one)")


def test_show_prints_the_ledger_its_restarts_and_a_damaged_ledger_as_a_note(costed, capsys):
    """Its hours, goodput, buckets and restarts; nothing for a record without a ledger; a damaged
    ledger's figures blank, in show and compare, with a line naming the record."""
    assert main(["show", str(costed / "b")]) == 0
    out = capsys.readouterr().out
    at = out.splitlines().index("ledger    2 worker-hours (2 workers x 3600 s), goodput 50%")
    assert out.splitlines()[at + 1 : at + 7] == [
        "  startup                    720.0 s   10%",
        "  productive                3600.0 s   50%",
        "  lost                      1800.0 s   25%",
        "  restart                    720.0 s   10%",
        "  other                      360.0 s    5%",
        "  attempt 1 restarted from step 40 (the group before had reached step 65): lost 1800.0 s, restart 720.0 s",
    ]
    with_ledger(costed / "c", dataclasses.replace(C, unseen="failure.watchdog=false: no worker reported its time"))
    assert main(["show", str(costed / "c")]) == 0
    assert "  not split by bucket: failure.watchdog=false: no worker reported its time" in capsys.readouterr().out
    assert main(["show", str(costed / "d")]) == 0
    assert "\nledger" not in capsys.readouterr().out

    record = json.loads((costed / "a" / "summary.json").read_text())
    record["ledger"].update(allocated_s="NaN", buckets={"startup": "soon", "productive": 2520})
    (costed / "a" / "summary.json").write_text(json.dumps(record))
    damaged = f"{costed / 'a' / 'summary.json'}: the ledger's startup, allocated_s are no number of seconds; left blank.\n"
    assert main(["show", str(costed / "a")]) == 0
    out, err = capsys.readouterr()
    assert "ledger    ? worker-hours (2 workers x 1800 s), goodput unknown\n  productive" in out and err == f"raydra show: {damaged}"
    records, err = as_json(capsys, costed / "a", "--cost")
    assert records[0]["worker-h"] is None and err == f"raydra compare: {damaged}"
