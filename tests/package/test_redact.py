"""Which names hold secrets: values under secret-named keys, environment variables and overrides are
masked; config whose key merely contains the letters (model.parts.tokenizer) is recorded as it is."""

import sys

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from raydra.entry import CONF_DIR
from raydra.redact import MASK, _plain, names_a_secret, redact, redact_yaml_files

ORDINARY = [
    "tokenizer",
    "tokenizer_config",
    "model.parts.tokenizer",
    "max_tokens",
    "max_new_tokens",
    "keyframes",
    "monkey",
    "exclude_keys",
    "key_dim",
    "token_dropout",
    "pad_token",
    "eos_token_id",
    "keyPoints",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN_PATH",
    "SSH_AUTH_SOCK",
    "TOKENIZERS_PARALLELISM",
]
SECRET = [
    "api_key",
    "apiKey",
    "token",
    "HF_TOKEN",
    "hfToken",
    "HFToken",
    "access_token",
    "WANDB_API_KEY",
    "AWS_SECRET_ACCESS_KEY",
    "aws_secret_access_key",
    "AWS_SESSION_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "RAY_AUTH_TOKEN",
    "password",
    "PGPASSWORD",
    "db-passwd",
    "secret",
    "client_secret",
    "credentials",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "auth",
    "http_auth",
    "logger.wandb.api_key",
    "+hydra.job.env_set.HF_TOKEN",
]


@pytest.mark.parametrize("name", ORDINARY)
def test_a_name_that_only_contains_key_or_token_is_no_secret(name):
    assert not names_a_secret(name)


@pytest.mark.parametrize("name", SECRET)
def test_a_name_that_names_a_secret_is_one(name):
    assert names_a_secret(name)


def test_config_keys_named_like_secrets_are_masked_and_others_kept():
    config = {
        "model": {
            "parts": {"tokenizer": {"vocab_size": 1000, "max_length": 16}, "keyframes": [1, 2]},
            "max_tokens": 77,
            "pad_token": "<|endoftext|>",
        },
        "logger": {"wandb": {"api_key": "abc123secret", "project": "raydra"}},
        "db": {"credentials": {"user": "me", "pass": "pw-987654"}, "PGPASSWORD": "pw-987654"},
        # A flag says whether a token is used, not what it is.
        "data": {"use_auth_token": True, "token": None},
    }
    assert redact(config, []) == {
        "model": config["model"],
        "logger": {"wandb": {"api_key": MASK, "project": "raydra"}},
        "db": {"credentials": MASK, "PGPASSWORD": MASK},
        "data": {"use_auth_token": True, "token": None},
    }


def test_only_secret_named_environment_variables_have_their_values_masked(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdef123")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws/secret+987")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-tok-555")
    # Ray's token file and a tokenizer folder are paths, not secrets: runs write them freely.
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/home/me/.ray/auth_token")
    monkeypatch.setenv("TOKENIZER_DIR", "/data/tokenizers/clip")
    record = {
        "error": "hf_abcdef123 and aws/secret+987 and session-tok-555 were refused",
        "paths": ["/home/me/.ray/auth_token", "/data/tokenizers/clip/vocab.json"],
    }
    assert redact(record) == {"error": "*** and *** and *** were refused", "paths": record["paths"]}


def test_overrides_mask_secret_named_values_alone_or_joined():
    overrides = [
        "model.parts.tokenizer.vocab_size=500",
        "data.max_tokens=4096",
        "+logger.wandb.api_key=abc123secret",
        "+hydra.job.env_set.HF_TOKEN=hf_abcdef123",
        "tags=[a,b]",
    ]
    assert redact(overrides, []) == [
        "model.parts.tokenizer.vocab_size=500",
        "data.max_tokens=4096",
        "+logger.wandb.api_key=***",
        "+hydra.job.env_set.HF_TOKEN=***",
        "tags=[a,b]",
    ]
    # Hydra's override_dirname joins them with commas, the secret not necessarily first.
    joined = "+logger.csv.flush=5,+logger.wandb.api_key=abc123secret,model.parts.tokenizer.vocab_size=500"
    assert redact(joined, []) == "+logger.csv.flush=5,+logger.wandb.api_key=***,model.parts.tokenizer.vocab_size=500"
    # Text that shows the syntax is no override.
    usage = "Usage: python train.py [group=option ...] [key=value ...]"
    assert redact(usage, []) == usage


# Secrets inside an override's value: a dict at any depth, in a list, in each choice of a sweep.
NESTED = {
    "ray.runtime_env={env_vars: {MY_API_TOKEN: tok-4711-nested, OMP_NUM_THREADS: 2}}": "ray.runtime_env={env_vars:{MY_API_TOKEN:***,OMP_NUM_THREADS:2}}",
    "+db={credentials: {user: me, pass: pw-98765}, host: 'db.example:5432'}": '+db={credentials:***,host:"db.example:5432"}',
    "+hooks=[{name: slack, webhook: {url: 'https://h/x', auth: 'Bearer sk-123456'}}, {name: log}]": (
        '+hooks=[{name:slack,webhook:{url:"https://h/x",auth:***}},{name:log}]'
    ),
    "+x.creds={HF_TOKEN: hf_one1234},{HF_TOKEN: hf_two1234}": "+x.creds={HF_TOKEN:***},{HF_TOKEN:***}",
    "+x.opt=shuffle(choice({api_key: k-1234567, n: 1}, plain))": "+x.opt=shuffle(choice({api_key:***,n:1},plain))",
}
# Keys that only contain the letters, a flag, an empty one, a quoted string that merely looks like a dict.
ORDINARY_OVERRIDES = [
    "+model.parts={tokenizer: {vocab_size: 1000, max_tokens: 77}, pad_token: '<pad>', keyframes: [1, 2]}",
    "+data.hub={use_auth_token: true, token: null, name: x}",
    "+note='a {token: t} in words'",
    "model.optimizer.lr=1e-3,1e-2",
]


def test_secrets_inside_an_overrides_value_are_masked_at_any_depth_and_it_means_the_same():
    """An override is masked by the config's rule at any depth of its value, and written back in
    Hydra's grammar: parsed again it is the value given, with *** for each secret."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert redact(list(NESTED) + ORDINARY_OVERRIDES, []) == list(NESTED.values()) + ORDINARY_OVERRIDES
    parser = OverridesParser.create()
    for given, masked in NESTED.items():
        before, after = parser.parse_override(given), parser.parse_override(masked)
        assert after.key_or_group == before.key_or_group and after.type == before.type and after.value_type == before.value_type
        # The value given, with *** in place of each secret: what the config records under those keys.
        expected = redact(before.value() if not before.is_sweep_override() else before.value().list, [])
        got = after.value() if not after.is_sweep_override() else after.value().list
        assert _plain(got) == _plain(expected), given

    # Joined as Hydra's override_dirname, in Hydra's printed list of a failed job's overrides, and on
    # a log line where the words after the override are no part of it.
    joined = "+data.note=x,ray.runtime_env={env_vars: {MY_API_TOKEN: tok-4711-nested}},trainer.max_epochs=2"
    assert redact(joined, []) == "+data.note=x,ray.runtime_env={env_vars:{MY_API_TOKEN:***}},trainer.max_epochs=2"
    printed = "Error executing job with overrides: ['a=1', 'ray.runtime_env={env_vars: {MY_API_TOKEN: tok-4711-nested}}']"
    assert redact(printed, []) == "Error executing job with overrides: ['a=1', 'ray.runtime_env={env_vars:{MY_API_TOKEN:***}}']"
    line = "[1] failed after 3.1 s  ray.runtime_env={env_vars: {MY_API_TOKEN: 'tok 4711', B: 1}}: its process ended"
    assert redact(line, []) == "[1] failed after 3.1 s  ray.runtime_env={env_vars: {MY_API_TOKEN: ***, B: 1}}: its process ended"
    # Masked twice is masked once: a record read back and written again is unchanged.
    assert redact(list(NESTED.values()), []) == list(NESTED.values())


def _value_of(override: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(override).value()


def test_mask_in_a_secrets_place_is_told_from_a_secret_and_from_an_ordinary_value():
    """What a copied command would pass as a secret: *** where the record keeps it in place of one."""
    from raydra.redact import stands_for_a_secret

    assert stands_for_a_secret("+logger.wandb.api_key=***")
    assert stands_for_a_secret("ray.runtime_env={env_vars:{MY_API_TOKEN:***}}")
    assert not stands_for_a_secret("ray.runtime_env={env_vars:{MY_API_TOKEN:tok-4711-nested}}")
    assert not stands_for_a_secret("+data.note=***") and not stands_for_a_secret("tags=[***]")


def test_hydra_records_of_sd_tiny_stay_as_composed_and_resume_finds_no_change(tmp_path):
    """What the driver does to .hydra/ before a run, on sd_tiny's real composition: nothing in it
    is a secret, so resume= compares its own config with an unchanged record."""
    from raydra.config.schema import register_schemas
    from raydra.run.resume import changed_keys

    register_schemas()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=sd_tiny"], return_hydra_config=True)
    hydra_node = OmegaConf.to_container(cfg.hydra, resolve=False)
    del cfg.hydra
    records = tmp_path / ".hydra"
    records.mkdir()
    (records / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (records / "hydra.yaml").write_text(yaml.safe_dump({"hydra": hydra_node}, sort_keys=False))
    before = {p.name: p.read_text() for p in records.iterdir()}

    redact_yaml_files(tmp_path / ".hydra")

    assert {p.name: p.read_text() for p in records.iterdir()} == before
    recorded = yaml.safe_load((records / "config.yaml").read_text())
    assert recorded["model"]["parts"]["tokenizer"] == {"vocab_size": 1000, "max_length": 16}
    assert changed_keys(recorded, cfg) == []


def test_resume_compares_secrets_masked_and_never_prints_one():
    """The record holds *** for a secret: resume= with the same secret is no change, and a
    changed secret is refused without the new value in the message."""
    from raydra.run.resume import changed_keys

    recorded = {"model": {"lr": 0.1}, "logger": {"wandb": {"api_key": "***"}}}
    same = OmegaConf.create({"model": {"lr": 0.1}, "logger": {"wandb": {"api_key": "LEAKME12345"}}})
    assert changed_keys(recorded, same) == []
    changed = OmegaConf.create({"model": {"lr": 0.2}, "logger": {"wandb": {"api_key": "LEAKME12345"}}})
    lines = changed_keys(recorded, changed)
    assert lines == ["model.lr: 0.1 -> 0.2"] and "LEAKME12345" not in " ".join(lines)


def test_storage_uri_credentials_are_masked_and_its_other_options_kept():
    """paths.storage may carry pyarrow's S3 options, credentials among them."""
    uri = "s3://AKIDEXAMPLE:wJalrXUtnFEMI@bucket/p?endpoint_override=127.0.0.1:9000&secret_key=wJalrXUtnFEMI&scheme=http"
    masked = redact({"paths": {"storage": uri}}, [])["paths"]["storage"]
    assert "wJalrXUtnFEMI" not in masked and "AKIDEXAMPLE" not in masked
    assert masked == "s3://***@bucket/p?endpoint_override=127.0.0.1:9000&secret_key=***&scheme=http"
    override = 'paths.storage="s3://b/p?endpoint_override=127.0.0.1:9000&scheme=http"'
    assert redact(override, []) == override


# ---------------------------------------------------------------------------------------------
# Failure paths: what a failing run prints and writes. Secrets planted where users put them: in a
# storage URI, as an override's value, and inside the values of two overrides (a task's, Hydra's).

STORAGE_SECRET, LOGGER_SECRET = "storeSecret4711", "wandbKey0815xyz"
NESTED_SECRET, HOOK_SECRET = "nestedTok2323", "hookAuth9090"
PLANTED = (
    f"paths.storage='s3://bucket/p?endpoint_override=127.0.0.1:9&secret_key={STORAGE_SECRET}'",
    f"+logger.wandb.api_key={LOGGER_SECRET}",
)
NESTED_PLANTED = (
    f"ray.runtime_env={{env_vars: {{MY_API_TOKEN: {NESTED_SECRET}, OMP_NUM_THREADS: '1'}}}}",
    f"++hydra.job.env_set={{RAYDRA_PROBE: x, HOOK_AUTH: {HOOK_SECRET}}}",
)
SECRETS = (STORAGE_SECRET, LOGGER_SECRET, NESTED_SECRET, HOOK_SECRET)


def _leaks(done, outputs) -> list:
    """Where a planted secret shows: the console, or a file under the outputs."""
    found = [f"console: {line}" for line in (done.stdout + done.stderr).splitlines() if any(s in line for s in SECRETS)]
    for path in outputs.rglob("*"):
        if path.is_file() and any(s.encode() in path.read_bytes() for s in SECRETS):
            found.append(f"file: {path.relative_to(outputs)}")
    return found


def test_a_run_refused_at_start_up_prints_and_writes_its_secrets_masked(train_here, tmp_path):
    # A storage that cannot be written: the driver refuses it, quoting the URI, before Ray starts.
    done = train_here("scale.num_workers=1", "logger=csv", PLANTED[0], *NESTED_PLANTED, outputs=tmp_path)
    assert done.returncode == 1 and "storage cannot be written" in done.stdout
    assert "secret_key=***" in done.stdout and "secret_key=***" in next(tmp_path.rglob("driver.log")).read_text()
    assert _leaks(done, tmp_path) == []
    # An override Hydra cannot apply (no + for a key the config lacks): Hydra's error quotes it.
    done = train_here("logger=csv", f"logger.wandb.api_key={LOGGER_SECRET}", outputs=tmp_path)
    assert done.returncode == 1 and f"use +logger.wandb.api_key={MASK}" in done.stderr
    assert _leaks(done, tmp_path) == []
    # What the run's records say of the nested secrets: where they were, masked.
    (run,) = {p.parent.parent for p in tmp_path.rglob(".hydra/overrides.yaml")}
    recorded = yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text())
    assert 'ray.runtime_env={env_vars:{MY_API_TOKEN:***,OMP_NUM_THREADS:"1"}}' in recorded
    assert yaml.safe_load((run / "summary.json").read_text())["overrides"] == recorded
    hydra_overrides = yaml.safe_load((run / ".hydra" / "hydra.yaml").read_text())["hydra"]["overrides"]["hydra"]
    assert {"RAYDRA_PROBE": "x", "HOOK_AUTH": MASK} in [_value_of(o) for o in hydra_overrides]
    # A W&B key given as logger.wandb.api_key: refused by its name, before anything is written of it.
    done = train_here("scale.num_workers=1", PLANTED[1], outputs=tmp_path / "key")
    assert done.returncode == 1 and "logger.wandb.api_key cannot be set: set the WANDB_API_KEY environment variable" in done.stdout
    assert _leaks(done, tmp_path / "key") == []


@pytest.mark.parametrize("launcher", ["raydra", "basic"])
def test_a_multirun_refused_before_it_trains_prints_and_writes_its_secrets_masked(train_here, tmp_path, launcher):
    """A multirun over dicts that hold a secret: Hydra's multirun.yaml (written before any job, its
    config, hydra.overrides and override_dirname), multirun.log and the job's line in an error
    (raydra's launcher refuses the multirun before any job starts; Hydra's basic launcher runs
    each job, whose driver refuses it and whose launch Hydra logs)."""
    swept = f"ray.runtime_env={{env_vars: {{MY_API_TOKEN: {NESTED_SECRET}}}}},{{env_vars: {{MY_API_TOKEN: {NESTED_SECRET[::-1]}}}}}"
    gpu_only = ("experiment=vit_digits_smoke", "scale.num_workers=1", "trainer.precision=16-mixed")
    done = train_here("-m", f"hydra/launcher={launcher}", *gpu_only, PLANTED[1], swept, NESTED_PLANTED[1], outputs=tmp_path)
    assert done.returncode == 1 and "trainer.precision=16-mixed needs GPU workers" in done.stdout
    if launcher == "raydra":
        assert "multirun job #0 (ray.runtime_env={env_vars:{MY_API_TOKEN:***}}) cannot run" in done.stdout
    else:
        assert "#0 : " in done.stdout and "ray.runtime_env={env_vars:{MY_API_TOKEN:***}}" in done.stdout
    (multirun,) = tmp_path.rglob("multirun.yaml")
    assert "ray.runtime_env={env_vars:{MY_API_TOKEN:***}},{env_vars:{MY_API_TOKEN:***}}" in multirun.read_text()
    assert _leaks(done, tmp_path) == [] and NESTED_SECRET[::-1] not in done.stdout + multirun.read_text()


@pytest.mark.e2e
def test_a_run_failing_mid_run_prints_and_writes_its_secrets_masked(train_here, tmp_path):
    # EarlyStopping (strict) on a metric nobody logs fails at the first epoch's end, with an error
    # Hydra reports itself, quoting the job's overrides.
    failing = ("callbacks=early_stopping", "callbacks.early_stopping.monitor=val/nothing", "trainer.max_epochs=1")
    failing += ("trainer.limit_train_batches=2", "trainer.limit_val_batches=1")
    done = train_here("scale.num_workers=0", "logger=[csv,wandb]", *NESTED_PLANTED, *failing, outputs=tmp_path)
    assert done.returncode == 1 and "Error executing job with overrides" in done.stderr
    (summary,) = tmp_path.rglob("summary.json")
    assert "Early stopping conditioned on metric `val/nothing`" in yaml.safe_load(summary.read_text())["error"]
    assert f"ray.runtime_env={{env_vars:{{MY_API_TOKEN:{MASK}" in done.stderr
    assert _leaks(done, tmp_path) == []


def test_a_stopped_multirun_says_where_its_secrets_go_and_resumes_only_with_them(monkeypatch, tmp_path, capsys):
    """raydra's launcher with Ray stood in (another app's jobs, as test_lifecycle.py's): stopped
    before its jobs ran, its record, its log, Hydra's multirun.yaml and the command that continues
    it hold *** for each secret, with a sentence saying to put them back; resumed, *** in a secret's
    place is refused, and the secrets passed again continue it."""
    from hydra_plugins.raydra_launcher.raydra_launcher import RaydraLauncherConf
    from raydra.errors import RaydraError
    from raydra.multirun import admission, launcher, outcome, scheduling
    from raydra.multirun.job import Job
    from raydra.records import jobs as jobs_record

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(admission, "_prepare_app_jobs", lambda multirun, jobs: [setattr(job, "share", 1.0) for job in jobs])
    monkeypatch.setattr(admission, "leave_joined_cluster", lambda: None)
    monkeypatch.setattr(scheduling, "_start", stopped)
    monkeypatch.setattr(sys, "argv", ["app.py"])
    sweep_dir = tmp_path / "m"
    typed = [PLANTED[1], NESTED_PLANTED[0], "x=1,2"]
    sweep_dir.mkdir()
    # As Hydra's sweeper leaves it before the launcher is called: the secrets in its config and overrides.
    hydra_node = {"overrides": {"task": typed}, "job": {"override_dirname": ",".join(typed)}}
    (sweep_dir / "multirun.yaml").write_text(yaml.safe_dump({"logger": {"wandb": {"api_key": LOGGER_SECRET}}, "hydra": hydra_node}))

    def multirun(*secrets: str, resume: bool = False):
        settings = RaydraLauncherConf(resume=resume)
        runs = launcher.Multirun(sweep_dir=sweep_dir, settings=settings, raydra_runs=False, typed=typed)
        jobs = [Job(num=n, overrides=[*secrets, f"x={n + 1}"], cfg=OmegaConf.create({}), dir=sweep_dir / str(n)) for n in range(2)]
        return runs, jobs

    runs, jobs = multirun(PLANTED[1], NESTED_PLANTED[0])
    with pytest.raises(KeyboardInterrupt):
        launcher.run_jobs(runs, jobs)
    outcome.report(runs, jobs)
    out = capsys.readouterr()
    record = jobs_record.read(sweep_dir)
    command = outcome.continue_command(runs)
    assert command == (
        "python app.py -m '+logger.wandb.api_key=***' 'ray.runtime_env={env_vars:{MY_API_TOKEN:***,OMP_NUM_THREADS:\"1\"}}' "
        f"x=1,2 hydra.sweep.dir={sweep_dir} hydra.launcher.resume=true"
    )
    left_out = "*** stands for a secret, which nothing records: put each back in its place (+logger.wandb.api_key, ray.runtime_env) before running it"
    assert f"  {command}\n  {left_out}\n" in out.out
    assert record.status == "interrupted" and record.error.endswith(f"{command}; {left_out}")
    assert yaml.safe_load((sweep_dir / "multirun.yaml").read_text())["logger"]["wandb"]["api_key"] == MASK
    found = [line for line in (out.out + out.err).splitlines() if any(s in line for s in SECRETS)]
    found += [p.name for p in sweep_dir.rglob("*") if p.is_file() and any(s.encode() in p.read_bytes() for s in SECRETS)]
    assert found == []

    # The command as printed: *** is no secret, and it would pass as one (the record compares masked).
    runs, jobs = multirun("+logger.wandb.api_key=***", NESTED_PLANTED[0], resume=True)
    with pytest.raises(RaydraError, match=r"\+logger.wandb.api_key=\*\*\* holds \*\*\*, which raydra records in place of a secret"):
        launcher.run_jobs(runs, jobs)
    assert jobs_record.read(sweep_dir) == record  # refused: the record as it was
    # With the secrets given again, it continues.
    runs, jobs = multirun(PLANTED[1], NESTED_PLANTED[0], resume=True)
    with pytest.raises(KeyboardInterrupt):
        launcher.run_jobs(runs, jobs)
    assert [r.from_status for r in jobs_record.read(sweep_dir).resumed] == ["interrupted"]
