"""The one exception type raydra raises for mistakes a user can fix, and the translation of other
errors into one sentence: a failed worker's own exception (one_line), a reader's message about a
file (whole_message), a RaydraError or a known user mistake wrapped in Ray's failure report
(user_error), a refused storage write (storage_error, storage_failure), a full disk (out_of_space),
a path that cannot be written before anything was (unwritable), a config file that is not YAML
(yaml_error), an override Hydra's grammar cannot read (override_error)."""

import errno
import os
import re
from typing import Optional


class RaydraError(Exception):
    """A user-facing error: its message is one sentence naming the key or path and the fix."""


# Set on an exception that a training function raised in the driver's own process (local mode):
# the rank whose logs/worker_<rank>.log holds its traceback (one_line names that file).
WORKER_RANK = "raydra_worker_rank"

# What the OS says when a disk, or a quota on it, is full.
OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)


def out_of_space(error: BaseException, path: object, what: str) -> "RaydraError | None":
    """A full disk met while writing `what` at `path`, as one sentence; None for any other error.
    pyarrow reports the OS's errno in its message only, so the message is read too."""
    if not isinstance(error, OSError):
        return None
    if error.errno not in OUT_OF_SPACE and not any(os.strerror(code) in str(error) for code in OUT_OF_SPACE):
        return None
    return RaydraError(
        f"the disk holding {path} is full: writing {what} failed, and nothing half-written was kept; "
        "free space there, then continue the run with resume=latest."
    )


def unwritable(error: BaseException, path: object, what: str, instead: str) -> "RaydraError | None":
    """`path` refused the write of `what` before anything of it was written (a full disk, a
    read-only filesystem, no permission, a name the filesystem cannot hold), as one sentence ending
    in `instead`, what to do; None for any other error."""
    if not isinstance(error, OSError):
        return None
    if error.errno in OUT_OF_SPACE:
        return RaydraError(f"the disk holding {path} is full: {what} cannot be written there; free space there, or {instead}.")
    if error.errno == errno.EROFS:
        return RaydraError(f"{path} is on a read-only filesystem: {what} cannot be written there; {instead}.")
    if error.errno in (errno.EACCES, errno.EPERM):
        return RaydraError(f"{path} cannot be written ({error.strerror}): {what} needs a directory you may write to; {instead}.")
    if error.errno == errno.ENAMETOOLONG:
        longest = max(len(part) for part in str(path).split(os.sep))
        return RaydraError(
            f"{path} is a name longer than the filesystem allows (a part of {longest} characters; most allow 255): {what} "
            f"cannot be created; {instead}."
        )
    return None


def yaml_error(error: BaseException) -> Optional[str]:
    """A config file that does not parse as YAML, as one sentence naming the file and the line."""
    import yaml

    if not isinstance(error, yaml.MarkedYAMLError):
        return None
    mark = error.problem_mark or error.context_mark
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}," if mark else "a config file"
    problem = (error.problem or "").strip()
    context = error.context_mark
    started = ""
    if error.context and context is not None and context is not mark:
        started = f" ({error.context} that starts at line {context.line + 1}, column {context.column + 1})"
    return f"{where} is not YAML: {problem}{started}; fix the file there."


def override_error(error: BaseException) -> Optional[str]:
    """A command-line override that Hydra's grammar cannot read (`'lr=[1e-3,2e-3'`, `'lr=range(1,'`),
    as one sentence naming it and its key: Hydra's own words name neither."""
    from hydra.errors import OverrideParseException

    if not isinstance(error, OverrideParseException):
        return None
    override = error.override
    key = override.partition("=")[0].lstrip("+~") or override
    # Hydra's first line is its parser's words, or "Error parsing override '...'" above them; the
    # lexer's is the override again, with a caret under the character it stopped at.
    lines = [line for line in (error.message or "").splitlines() if line.strip() and not line.startswith("Error parsing override")]
    first = lines[0].strip().rstrip(".") if lines else "Hydra's grammar refused it"
    reason = "a character it cannot take" if first.startswith("LexerNoViableAltException") else first
    return (
        f"{override} cannot be read as an override of {key} ({reason}); check that its brackets and quotes close, and quote "
        f"a value that holds spaces, commas or brackets, e.g. '{key}=\"...\"' (Hydra's override grammar: "
        "https://hydra.cc/docs/advanced/override_grammar/basic/)."
    )


def said(error: BaseException) -> str:
    """What a record says of the error that ended the work: a RaydraError's own sentence, else the
    error as one line (one_line)."""
    return str(error) if isinstance(error, RaydraError) else one_line(error)


def one_line(error: BaseException) -> str:
    """The error as one line; for a failed worker group, the lowest failed rank's own exception
    (Ray's first line only says that workers failed)."""
    if getattr(error, WORKER_RANK, None) is not None:
        # Raised by the training function in this process (local mode): the worker's own exception.
        rank = getattr(error, WORKER_RANK)
        return f"worker {rank}: {_first_line(error)[:400]} (the whole trace is in logs/worker_{rank}.log)"
    failures = getattr(error, "worker_failures", None) or {}
    if failures:
        rank = min(failures)
        # The worker's exception comes back as itself (Ray 2.60 unwraps it from its traceback
        # text), or as that text, whose last exception line is the one raised.
        raised = [line for line in str(failures[rank]).splitlines() if EXCEPTION_LINE.match(line)]
        return (
            f"worker {rank}: {(raised[-1] if raised else _first_line(failures[rank]))[:400]} (the whole trace is in logs/worker_{rank}.log)"
        )
    return _first_line(error)


def whole_message(error: BaseException) -> str:
    """The error's message, every line of it joined into one, cut at 200 characters: for a note about a
    file, whose reader (YAML's, JSON's, CSV's, pyarrow's) says where and what after its first line,
    which one_line keeps alone."""
    return " ".join(str(error).split())[:200]


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".strip()


# "ValueError: ...", "torch._dynamo.exc.InternalTorchDynamoError: ...": a traceback's last word.
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


def user_error(error: BaseException) -> Optional[RaydraError]:
    """A RaydraError raised on a worker (a missing data path, say), unwrapped from Ray's failure
    report so the user reads its one sentence instead of a worker's stack trace; or a known
    mistake of the user's code, said as one sentence (OLD_CONVENTION)."""
    failures = list(getattr(error, "worker_failures", {}).values()) + [error]
    for failure in failures:
        while failure is not None:
            if isinstance(failure, RaydraError):
                return RaydraError(str(failure).strip().splitlines()[-1])
            built = OLD_CONVENTION.search(str(failure))
            if built:
                kind = "partial" if built["kind"] in ("partial", "_DeferredTarget") else built["kind"]
                return RaydraError(
                    f"the model calls hydra.utils.instantiate on a {kind} that raydra has already built, as Hydra builds a "
                    "model (a _partial_ optimizer or scheduler arrives as a partial, a nested _target_ as its object): call it "
                    "instead (self.hparams.optimizer(params=self.parameters())), or add `_recursive_: false` to the model's "
                    "YAML to get plain config (docs/own-project.md)."
                )
            failure = failure.__cause__ or getattr(failure, "cause", None)
    return None


# Hydra's words for instantiate() called on something already built (a module written for raydra's
# earlier convention, `instantiate(self.hparams.optimizer)`, now handed a functools.partial).
OLD_CONVENTION = re.compile(r"Cannot instantiate config of type (?P<kind>\w+)")


# What pyarrow says when a store refuses or misses a write (S3's words; GCS's are alike).
STORAGE_FAILURE = ("AWS Error", "ACCESS_DENIED", "AccessDenied", "NoSuchBucket", "When creating key", "google::cloud::Status")


def storage_failure(storage_root: Optional[str], error: BaseException) -> Optional[RaydraError]:
    """A storage failure on a Ray node (the Train controller or a worker) as one sentence. The
    driver's own check passed, so the node differs: most often it lacks the credentials, which
    pyarrow reads from each node's own environment. `storage_root`: paths.storage, when the run has storage."""
    if not storage_root or not any(word in str(error) for word in STORAGE_FAILURE):
        return None
    reason = storage_error(storage_root, error).rstrip(".")
    return RaydraError(
        f"{reason}, on a Ray node: give every node the credentials in its own environment (they are not sent from the driver)."
    )


def storage_error(where: str, error: BaseException) -> str:
    """One sentence for a storage failure: which of the usual causes it is, and what to do."""
    text = str(error)
    lower = text.lower()
    key = f"paths.storage={where}"
    if "unrecognized filesystem type" in lower or "no filesystem" in lower or "unknown filesystem" in lower:
        return f"{key}: no installed filesystem serves this URI scheme ({text.splitlines()[0]}); use s3://, gs://, hdfs:// or a local/NFS path."
    if "nosuchbucket" in lower or ("bucket" in lower and ("not found" in lower or "does not exist" in lower)):
        return f"{key}: the bucket does not exist; create it first (e.g. `aws s3 mb`) or fix the bucket name."
    if any(
        word in lower
        for word in ("accessdenied", "access denied", "forbidden", "invalidaccesskeyid", "signaturedoesnotmatch", "credentials", "403")
    ):
        return (
            f"{key}: storage refused access ({text.splitlines()[0][:200]}); set credentials that may write there "
            "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, for s3://; GOOGLE_APPLICATION_CREDENTIALS for gs://)."
        )
    if any(word in lower for word in ("connect", "resolve host", "timed out", "timeout", "unreachable", "curl error")):
        return (
            f"{key}: the storage endpoint cannot be reached ({text.splitlines()[0][:200]}); check the host and port "
            "(endpoint_override= in the URI, or AWS_ENDPOINT_URL) and that the server is up."
        )
    return f"{key}: storage cannot be written ({text.splitlines()[0][:300] if text else type(error).__name__}); check the URI and its permissions."
