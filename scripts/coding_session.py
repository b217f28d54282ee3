"""The long example session: examples/coding-session.json.

A made-up but realistic multi-turn OpenAI tool-calling session: an agent
working on `tinyq`, a small Python job-queue library, through four user asks
(fix a failing test, add a feature, rename a class, update the docs). Large
file reads, grep output, a failing pytest run with a traceback, the fix, the
passing run and a git diff, the way real agents produce them. The peak request
is around 50k tokens, so replaying it with a 32k window compacts.

Deterministic (no randomness, no clock): imported by make-example-session.py.
"""
import json

SYSTEM = (
    "You are a coding agent working in the repository at /work/tinyq. "
    "Tools: `bash` runs a shell command and returns its exit code and output; "
    "`read_file` shows a file with line numbers; `write_file` creates or overwrites a file; "
    "`str_replace` replaces one exact occurrence of `old` with `new` in a file. "
    "Read before you edit, keep changes minimal, run the tests before you say you are done, "
    "and answer with a short summary of what you changed."
)

ERRORS = [
    ("ConnectionResetError", True, "the broker dropped the connection mid-frame"),
    ("ConnectionRefusedError", True, "the broker is restarting or not yet listening"),
    ("TimeoutError", True, "no acknowledgement within the visibility timeout"),
    ("BrokenPipeError", True, "the socket closed while the payload was being written"),
    ("BrokerUnavailable", True, "every broker in the cluster list refused the connection"),
    ("LeaseExpired", True, "another worker may have taken the job; safe to retry"),
    ("RateLimited", True, "the broker asked us to back off; honour its retry-after"),
    ("SerializationError", False, "the payload cannot be encoded; retrying cannot help"),
    ("PayloadTooLarge", False, "the job exceeds the broker's frame limit"),
    ("PermissionError", False, "credentials were rejected; a human must fix the config"),
    ("JobCancelled", False, "the producer cancelled the job; drop it"),
    ("ValueError", False, "the handler rejected its arguments"),
    ("KeyError", False, "the handler looked up a missing field"),
    ("MemoryError", False, "the worker ran out of memory; restart it rather than retry"),
    ("ReadOnlyReplica", True, "the broker failed over and this node is a replica for a moment"),
    ("ClusterDown", True, "the cluster is re-electing a primary"),
    ("TryAgain", True, "a multi-key command hit a slot being migrated"),
    ("ChannelClosed", True, "the AMQP channel was closed by the server"),
    ("HandlerTimeout", True, "the handler ran past its time limit; it may succeed on a quieter node"),
    ("UnknownHandler", False, "no handler is registered under the job's name"),
    ("SchemaMismatch", False, "the payload was written by an incompatible producer version"),
    ("TenantSuspended", False, "the tenant's account is suspended; jobs are dropped by policy"),
    ("QuotaExceeded", True, "the tenant hit its hourly quota; the next window will accept the job"),
    ("PayloadNotUtf8", False, "the payload is not valid UTF-8"),
]

CONFIG_FIELDS = [
    ("broker_url", "str", '"redis://localhost:6379/0"', "Where the queue lives (redis:// or amqp://)."),
    ("queue_name", "str", '"default"', "The queue this worker consumes."),
    ("concurrency", "int", "4", "Jobs run at once by one worker process."),
    ("prefetch", "int", "8", "Jobs fetched ahead of time; at least `concurrency`."),
    ("visibility_timeout", "float", "30.0", "Seconds a fetched job stays invisible to other workers."),
    ("heartbeat_interval", "float", "5.0", "Seconds between lease renewals for a running job."),
    ("max_attempts", "int", "5", "Attempts before a job goes to the dead-letter queue."),
    ("base_delay", "float", "1.0", "First retry delay, in seconds."),
    ("backoff_factor", "float", "2.0", "Each retry waits this many times longer than the last."),
    ("max_delay", "float", "300.0", "No retry waits longer than this, in seconds."),
    ("dead_letter_queue", "str", '"dead"', "Where jobs that exhausted their attempts go."),
    ("result_ttl", "float", "86400.0", "Seconds a finished job's result is kept."),
    ("shutdown_grace", "float", "20.0", "Seconds running jobs get to finish on SIGTERM."),
    ("log_level", "str", '"INFO"', "The worker's log level."),
    ("metrics_port", "int", "0", "Port of the Prometheus endpoint; 0 turns it off."),
    ("poll_interval", "float", "0.5", "Seconds between polls of an empty queue."),
    ("max_job_seconds", "float", "600.0", "A handler running longer than this is interrupted (HandlerTimeout)."),
    ("tenant_quota_per_hour", "int", "10000", "Jobs a tenant may run per hour; 0 means no quota."),
    ("results_backend", "str", '"broker"', "Where results are kept: the broker, or a URL of a separate Redis."),
    ("tls_ca_file", "str", '"system"', "CA bundle for rediss:// and amqps://; `system` uses the OS store."),
    ("connect_timeout", "float", "5.0", "Seconds to wait for the broker connection at start-up."),
    ("reconnect_attempts", "int", "10", "Reconnections tried before the worker exits."),
    ("job_history_size", "int", "1000", "Finished job ids kept per queue for the status endpoint."),
    ("hostname", "str", '"auto"', "Name reported in heartbeats; `auto` uses the machine's host name."),
]

HANDLERS = [
    "send_invoice_email", "resize_avatar", "sync_crm_contact", "rebuild_search_index",
    "expire_sessions", "generate_monthly_report", "charge_subscription", "refresh_exchange_rates",
    "purge_soft_deleted", "notify_webhook", "compress_upload", "reconcile_ledger",
]


def numbered(text):
    """`text` with line numbers, the way the read_file tool shows it."""
    lines = text.split("\n")
    return "\n".join(f"{n:5d}\t{line}" for n, line in enumerate(lines, start=1))


def camel(name):
    return "".join(part.capitalize() for part in name.split("_"))


# --------------------------------------------------------------------------
# Source files of the repository (as they are before the agent's changes).
# --------------------------------------------------------------------------

def retry_py(cls="Backoff", fixed=False, jitter=False):
    capped = (
        "        raw = self.base_delay * self.factor ** (attempt - 1)\n"
        "        delay = min(raw, self.max_delay)"
        if fixed else
        "        capped_base = min(self.base_delay, self.max_delay)\n"
        "        delay = capped_base * self.factor ** (attempt - 1)"
    )
    jitter_field = (
        "    jitter: float = 0.0\n"
        "    \"\"\"Fraction of the delay drawn at random (0 = none, 1 = full jitter).\"\"\"\n"
        if jitter else ""
    )
    jitter_apply = (
        "        if self.jitter:\n"
        "            spread = delay * self.jitter\n"
        "            delay = delay - spread + rng.random() * spread\n"
        if jitter else ""
    )
    rng_param = ", rng: random.Random | None = None" if jitter else ""
    rng_line = "        rng = rng or random.Random()\n" if jitter else ""
    out = [
        '"""Retry policy for tinyq jobs.',
        "",
        "A job that raises is retried with an exponential backoff until it succeeds,",
        "its attempts run out, or the error is known to be permanent. This module",
        "decides *whether* to retry (error classification) and *when* (the delay);",
        "the worker owns the clock and the re-enqueueing.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "import dataclasses",
        "import logging",
        "import random" if jitter else "import math",
        "from typing import Callable, Iterable, Iterator",
        "",
        "from tinyq import errors",
        "",
        "log = logging.getLogger(__name__)",
        "",
        "#: Errors that are worth another attempt, with the reason shown in logs.",
        "TRANSIENT: dict[str, str] = {",
    ]
    out += [f'    "{name}": "{why}",' for name, ok, why in ERRORS if ok]
    out += ["}", "", "#: Errors that no retry can fix: the job goes to the dead-letter queue.", "PERMANENT: dict[str, str] = {"]
    out += [f'    "{name}": "{why}",' for name, ok, why in ERRORS if not ok]
    out += [
        "}",
        "",
        "",
        "class RetryExhausted(errors.TinyqError):",
        '    """Raised when a job failed on its last allowed attempt."""',
        "",
        "    def __init__(self, job_id: str, attempts: int, last_error: BaseException):",
        '        super().__init__(f"job {job_id} failed {attempts} times; last error: {last_error!r}")',
        "        self.job_id = job_id",
        "        self.attempts = attempts",
        "        self.last_error = last_error",
        "",
        "",
        "@dataclasses.dataclass(frozen=True)",
        f"class {cls}:",
        '    """Exponential backoff: attempt n waits base_delay * factor ** (n - 1),',
        "    never more than max_delay.",
        "",
        "    Attempts are counted from 1 (the first retry is attempt 1).",
        '    """',
        "",
        "    base_delay: float = 1.0",
        '    """First retry delay, in seconds."""',
        "    factor: float = 2.0",
        '    """Growth of the delay from one attempt to the next."""',
        "    max_delay: float = 300.0",
        '    """Cap on any single delay, in seconds."""',
        "    max_attempts: int = 5",
        '    """Attempts before the job is given up."""',
    ]
    if jitter_field:
        out += jitter_field.rstrip("\n").split("\n")
    out += [
        "",
        "    def __post_init__(self) -> None:",
        "        if self.base_delay < 0:",
        '            raise ValueError(f"base_delay must be >= 0, got {self.base_delay}")',
        "        if self.factor < 1:",
        '            raise ValueError(f"factor must be >= 1, got {self.factor}")',
        "        if self.max_delay < self.base_delay:",
        '            raise ValueError("max_delay must be >= base_delay")',
        "        if self.max_attempts < 1:",
        '            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")',
    ]
    if jitter:
        out += [
            "        if not 0.0 <= self.jitter <= 1.0:",
            '            raise ValueError(f"jitter must be within [0, 1], got {self.jitter}")',
        ]
    out += [
        "",
        f"    def delay(self, attempt: int{rng_param}) -> float:",
        '        """Seconds to wait before retry number `attempt` (from 1)."""',
        "        if attempt < 1:",
        '            raise ValueError(f"attempt must be >= 1, got {attempt}")',
    ]
    out += capped.split("\n")
    if jitter:
        out += rng_line.rstrip("\n").split("\n") + jitter_apply.rstrip("\n").split("\n")
    out += [
        "        return delay",
        "",
        "    def delays(self) -> Iterator[float]:",
        '        """Every delay this policy allows, in order."""',
        "        for attempt in range(1, self.max_attempts):",
        "            yield self.delay(attempt)",
        "",
        "    def total_delay(self) -> float:",
        '        """Worst-case time a job spends waiting between its attempts."""',
        "        return sum(self.delays())",
        "",
        "    def should_retry(self, attempt: int, error: BaseException) -> bool:",
        '        """Whether a job that raised `error` on `attempt` gets another one."""',
        "        if attempt >= self.max_attempts:",
        "            return False",
        "        return classify(error) != \"permanent\"",
        "",
        "    @classmethod",
        f"    def from_config(cls, config) -> \"{cls}\":",
        '        """The policy a worker configuration asks for."""',
        "        return cls(",
        "            base_delay=config.base_delay,",
        "            factor=config.backoff_factor,",
        "            max_delay=config.max_delay,",
        "            max_attempts=config.max_attempts,",
    ]
    if jitter:
        out += ["            jitter=config.retry_jitter,"]
    out += [
        "        )",
        "",
        "",
        "def classify(error: BaseException) -> str:",
        '    """"transient", "permanent" or "unknown" for an exception, by its class',
        "    name and then by its bases (a subclass of a transient error is transient).",
        '    """',
        "    for klass in type(error).__mro__:",
        "        if klass.__name__ in TRANSIENT:",
        '            return "transient"',
        "        if klass.__name__ in PERMANENT:",
        '            return "permanent"',
        '    return "unknown"',
        "",
        "",
        "def reason(error: BaseException) -> str:",
        '    """The log line explaining what will happen to a job that raised `error`."""',
        "    name = type(error).__name__",
        "    if name in TRANSIENT:",
        '        return f"{name}: {TRANSIENT[name]} (will retry)"',
        "    if name in PERMANENT:",
        '        return f"{name}: {PERMANENT[name]} (giving up)"',
        '    return f"{name}: unclassified error (will retry)"',
        "",
    ]
    # One small predicate per known error, the way the real module grew.
    for name, ok, why in ERRORS:
        snake = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
        out += [
            "",
            f"def is_{snake}(error: BaseException) -> bool:",
            f'    """Whether `error` is a {name}: {why}."""',
            f'    return any(k.__name__ == "{name}" for k in type(error).__mro__)',
        ]
    out += [
        "",
        "",
        "def retry_call(",
        "    fn: Callable[[], object],",
        f"    policy: {cls},",
        "    *,",
        "    sleep: Callable[[float], None],",
        "    on_retry: Callable[[int, BaseException, float], None] | None = None,",
        "    job_id: str = \"<inline>\",",
        ") -> object:",
        '    """Calls `fn` until it returns, retrying transient failures with `policy`.',
        "",
        "    `sleep` is injected so tests and the async worker control the clock.",
        '    """',
        "    attempt = 0",
        "    while True:",
        "        try:",
        "            return fn()",
        "        except Exception as error:  # noqa: BLE001 - classified below",
        "            attempt += 1",
        "            if not policy.should_retry(attempt, error):",
        "                raise RetryExhausted(job_id, attempt, error) from error",
        "            wait = policy.delay(attempt)",
        '            log.info("job %s attempt %d failed: %s; retrying in %.1fs", job_id, attempt, reason(error), wait)',
        "            if on_retry is not None:",
        "                on_retry(attempt, error, wait)",
        "            sleep(wait)",
        "",
        "",
        f"def schedule(policy: {cls}, failures: Iterable[float]) -> list[float]:",
        '    """The times (seconds from the first failure) at which retries happen,',
        "    given how long each attempt ran before failing.",
        '    """',
        "    now = 0.0",
        "    out = []",
        "    for attempt, ran_for in enumerate(failures, start=1):",
        "        if attempt >= policy.max_attempts:",
        "            break",
        "        now += ran_for + policy.delay(attempt)",
        "        out.append(now)",
        "    return out",
        "",
    ]
    if not jitter:
        out += [
            "",
            f"def attempts_within(policy: {cls}, budget: float) -> int:",
            '    """How many retries fit in `budget` seconds of waiting."""',
            "    total = 0.0",
            "    for n, wait in enumerate(policy.delays(), start=1):",
            "        total += wait",
            "        if total > budget or math.isclose(total, budget) and total != budget:",
            "            return n - 1",
            "    return policy.max_attempts - 1",
            "",
        ]
    return "\n".join(out)


def test_retry_py(extra=""):
    out = [
        '"""Tests of tinyq.retry."""',
        "",
        "import pytest",
        "",
        "from tinyq import errors",
        "from tinyq.retry import Backoff, RetryExhausted, classify, reason, retry_call, schedule",
        "",
        "",
        "class Flaky:",
        '    """Raises `error` the first `failures` times it is called."""',
        "",
        "    def __init__(self, failures, error):",
        "        self.failures = failures",
        "        self.error = error",
        "        self.calls = 0",
        "",
        "    def __call__(self):",
        "        self.calls += 1",
        "        if self.calls <= self.failures:",
        "            raise self.error",
        '        return "done"',
        "",
        "",
        "def test_first_delay_is_base_delay():",
        "    assert Backoff(base_delay=0.5).delay(1) == 0.5",
        "",
        "",
        "def test_delays_grow_by_factor():",
        "    policy = Backoff(base_delay=1, factor=3, max_delay=1000)",
        "    assert [policy.delay(n) for n in range(1, 5)] == [1, 3, 9, 27]",
        "",
        "",
        "def test_backoff_caps_at_max_delay():",
        "    policy = Backoff(base_delay=1, factor=2, max_delay=30)",
        "    assert policy.delay(10) == 30",
        "",
        "",
        "def test_total_delay_counts_every_wait():",
        "    policy = Backoff(base_delay=1, factor=2, max_delay=100, max_attempts=4)",
        "    assert policy.total_delay() == 1 + 2 + 4",
        "",
        "",
        '@pytest.mark.parametrize("attempt", [0, -1])',
        "def test_attempts_count_from_one(attempt):",
        "    with pytest.raises(ValueError):",
        "        Backoff().delay(attempt)",
        "",
        "",
        '@pytest.mark.parametrize("kwargs", [',
        '    {"base_delay": -1},',
        '    {"factor": 0.5},',
        '    {"max_delay": 0.1, "base_delay": 1},',
        '    {"max_attempts": 0},',
        "])",
        "def test_invalid_policies_are_rejected(kwargs):",
        "    with pytest.raises(ValueError):",
        "        Backoff(**kwargs)",
        "",
    ]
    for name, ok, why in ERRORS:
        kind = "transient" if ok else "permanent"
        make = f"{name}()" if name in ("ConnectionResetError", "ConnectionRefusedError", "TimeoutError", "BrokenPipeError", "PermissionError", "ValueError", "KeyError", "MemoryError") else f"errors.{name}()"
        snake = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
        out += [
            "",
            f"def test_{snake}_is_{kind}():",
            f"    assert classify({make}) == \"{kind}\"",
            f"    assert \"{'will retry' if ok else 'giving up'}\" in reason({make})",
            "",
        ]
    out += [
        "",
        "def test_retry_call_retries_transient_errors():",
        "    flaky = Flaky(2, TimeoutError())",
        "    slept = []",
        "    assert retry_call(flaky, Backoff(), sleep=slept.append) == \"done\"",
        "    assert slept == [1.0, 2.0]",
        "",
        "",
        "def test_retry_call_gives_up_on_permanent_errors():",
        "    flaky = Flaky(1, errors.SerializationError())",
        "    with pytest.raises(RetryExhausted) as info:",
        "        retry_call(flaky, Backoff(), sleep=lambda s: None, job_id=\"j1\")",
        "    assert info.value.attempts == 1",
        "    assert flaky.calls == 1",
        "",
        "",
        "def test_retry_call_stops_after_max_attempts():",
        "    flaky = Flaky(10, TimeoutError())",
        "    with pytest.raises(RetryExhausted):",
        "        retry_call(flaky, Backoff(max_attempts=3), sleep=lambda s: None)",
        "    assert flaky.calls == 3",
        "",
        "",
        "def test_schedule_adds_run_time_and_delay():",
        "    assert schedule(Backoff(max_attempts=4), [0.5, 0.5, 0.5, 0.5]) == [1.5, 4.0, 8.5]",
        "",
    ]
    return "\n".join(out) + extra


def config_py():
    out = [
        '"""Worker configuration: defaults, environment (TINYQ_*), and a TOML file."""',
        "",
        "from __future__ import annotations",
        "",
        "import dataclasses",
        "import os",
        "import tomllib",
        "from pathlib import Path",
        "from typing import Any, Mapping",
        "",
        "from tinyq.errors import ConfigError",
        "",
        'ENV_PREFIX = "TINYQ_"',
        "",
        "",
        "@dataclasses.dataclass",
        "class WorkerConfig:",
        '    """Everything a worker process reads at start-up.',
        "",
        "    Precedence: keyword arguments, then the environment, then the TOML file,",
        "    then these defaults.",
        '    """',
        "",
    ]
    for name, ty, default, doc in CONFIG_FIELDS:
        out += [f"    {name}: {ty} = {default}", f'    """{doc}"""']
    out += [
        "",
        "    def validate(self) -> None:",
        '        """Raises ConfigError naming the first bad field."""',
    ]
    for name, ty, default, doc in CONFIG_FIELDS:
        out.append(f"        _check_{name}(self.{name})")
    out += [
        "        if self.prefetch < self.concurrency:",
        '            raise ConfigError("prefetch", f"must be >= concurrency ({self.concurrency})")',
        "        if self.max_delay < self.base_delay:",
        '            raise ConfigError("max_delay", "must be >= base_delay")',
        "",
        "    @classmethod",
        '    def load(cls, path: Path | None = None, env: Mapping[str, str] | None = None, **overrides: Any) -> "WorkerConfig":',
        '        """Defaults, then `path` (TOML, table [worker]), then `env`, then `overrides`."""',
        "        values: dict[str, Any] = {}",
        "        if path is not None:",
        "            values.update(_from_toml(path))",
        "        values.update(_from_env(os.environ if env is None else env))",
        "        values.update(overrides)",
        "        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}",
        "        if unknown:",
        '            raise ConfigError(sorted(unknown)[0], "unknown setting")',
        "        config = cls(**values)",
        "        config.validate()",
        "        return config",
        "",
        "    def as_dict(self) -> dict[str, Any]:",
        '        """The settings, for logs and the /config endpoint."""',
        "        return dataclasses.asdict(self)",
        "",
        "",
        "def _from_toml(path: Path) -> dict[str, Any]:",
        "    try:",
        "        data = tomllib.loads(path.read_text())",
        "    except (OSError, tomllib.TOMLDecodeError) as error:",
        '        raise ConfigError(str(path), f"cannot read: {error}") from error',
        '    table = data.get("worker", {})',
        "    if not isinstance(table, dict):",
        '        raise ConfigError(str(path), "[worker] must be a table")',
        "    return table",
        "",
        "",
        "def _from_env(env: Mapping[str, str]) -> dict[str, Any]:",
        "    out: dict[str, Any] = {}",
        "    types = {f.name: f.type for f in dataclasses.fields(WorkerConfig)}",
        "    for key, raw in env.items():",
        "        if not key.startswith(ENV_PREFIX):",
        "            continue",
        "        name = key[len(ENV_PREFIX):].lower()",
        "        if name not in types:",
        "            continue",
        "        out[name] = _parse(name, types[name], raw)",
        "    return out",
        "",
        "",
        "def _parse(name: str, ty: str, raw: str) -> Any:",
        "    try:",
        '        if ty == "int":',
        "            return int(raw)",
        '        if ty == "float":',
        "            return float(raw)",
        "    except ValueError as error:",
        '        raise ConfigError(name, f"expected {ty}, got {raw!r}") from error',
        "    return raw",
    ]
    for name, ty, default, doc in CONFIG_FIELDS:
        out += ["", ""]
        out.append(f"def _check_{name}(value: {ty}) -> None:")
        out.append(f'    """{doc}"""')
        if ty == "str":
            out += ["    if not value or value != value.strip():", f'        raise ConfigError("{name}", "must be a non-empty string without surrounding spaces")']
            if name == "broker_url":
                out += ['    if not value.startswith(("redis://", "rediss://", "amqp://", "amqps://")):', '        raise ConfigError("broker_url", f"unsupported scheme in {value!r}")']
            if name == "log_level":
                out += ['    if value.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR"}:', '        raise ConfigError("log_level", f"unknown level {value!r}")']
        elif ty == "int":
            low = 0 if name == "metrics_port" else 1
            out += [f"    if value < {low}:", f'        raise ConfigError("{name}", f"must be >= {low}, got {{value}}")']
            if name == "metrics_port":
                out += ["    if value > 65535:", '        raise ConfigError("metrics_port", "must be a TCP port (<= 65535)")']
        else:
            out += ["    if value != value or value < 0:", f'        raise ConfigError("{name}", f"must be a non-negative number, got {{value}}")']
            if name == "backoff_factor":
                out += ["    if value < 1:", '        raise ConfigError("backoff_factor", "must be >= 1 (delays never shrink)")']
    return "\n".join(out) + "\n"


def worker_py(cls="Backoff"):
    out = [
        '"""The worker process: fetch jobs, run their handlers, retry or bury failures."""',
        "",
        "from __future__ import annotations",
        "",
        "import logging",
        "import signal",
        "import threading",
        "import time",
        "from concurrent.futures import Future, ThreadPoolExecutor",
        "from typing import Callable",
        "",
        "from tinyq import metrics",
        "from tinyq.broker import Broker, Job",
        "from tinyq.config import WorkerConfig",
        f"from tinyq.retry import {cls}, RetryExhausted, classify, reason",
        "",
        "log = logging.getLogger(__name__)",
        "",
        "Handler = Callable[..., object]",
        "",
        "",
        "class Worker:",
        '    """Runs jobs from one queue with a thread pool.',
        "",
        "    The broker gives each fetched job a lease (the visibility timeout); a",
        "    heartbeat thread renews the leases of running jobs, so a slow job is",
        "    not handed to a second worker. A failed job is re-enqueued with the",
        "    delay its retry policy gives, or sent to the dead-letter queue.",
        '    """',
        "",
        "    def __init__(self, config: WorkerConfig, broker: Broker, handlers: dict[str, Handler]):",
        "        self.config = config",
        "        self.broker = broker",
        "        self.handlers = dict(handlers)",
        f"        self.policy = {cls}.from_config(config)",
        "        self._pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix=\"tinyq\")",
        "        self._running: dict[str, tuple[Job, Future]] = {}",
        "        self._lock = threading.Lock()",
        "        self._stopping = threading.Event()",
        "        self._heartbeat = threading.Thread(target=self._renew_leases, name=\"tinyq-heartbeat\", daemon=True)",
        "",
        "    # -- lifecycle ---------------------------------------------------------",
        "",
        "    def run(self) -> None:",
        '        """Runs until SIGTERM/SIGINT, then drains for `shutdown_grace` seconds."""',
        "        signal.signal(signal.SIGTERM, self._on_signal)",
        "        signal.signal(signal.SIGINT, self._on_signal)",
        "        self._heartbeat.start()",
        '        log.info("worker started on %s (concurrency %d)", self.config.queue_name, self.config.concurrency)',
        "        while not self._stopping.is_set():",
        "            free = self.config.prefetch - len(self._running)",
        "            if free <= 0:",
        "                time.sleep(self.config.poll_interval)",
        "                continue",
        "            jobs = self.broker.fetch(self.config.queue_name, limit=free, lease=self.config.visibility_timeout)",
        "            if not jobs:",
        "                time.sleep(self.config.poll_interval)",
        "                continue",
        "            for job in jobs:",
        "                self._submit(job)",
        "        self._drain()",
        "",
        "    def stop(self) -> None:",
        '        """Asks the loop to stop after the current fetch."""',
        "        self._stopping.set()",
        "",
        "    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002 - signal API",
        '        log.info("received signal %d, shutting down", signum)',
        "        self.stop()",
        "",
        "    def _drain(self) -> None:",
        "        deadline = time.monotonic() + self.config.shutdown_grace",
        "        while self._running and time.monotonic() < deadline:",
        "            time.sleep(0.1)",
        "        with self._lock:",
        "            leftovers = list(self._running.values())",
        "        for job, future in leftovers:",
        "            future.cancel()",
        "            self.broker.release(job)",
        '            log.warning("job %s released unfinished at shutdown", job.id)',
        "        self._pool.shutdown(wait=False, cancel_futures=True)",
        "",
        "    # -- running jobs --------------------------------------------------------",
        "",
        "    def _submit(self, job: Job) -> None:",
        "        handler = self.handlers.get(job.name)",
        "        if handler is None:",
        '            log.error("no handler for job %s (%s); burying it", job.id, job.name)',
        '            self.broker.bury(job, self.config.dead_letter_queue, reason="no handler")',
        "            return",
        "        future = self._pool.submit(self._run, job, handler)",
        "        with self._lock:",
        "            self._running[job.id] = (job, future)",
        "",
        "    def _run(self, job: Job, handler: Handler) -> None:",
        "        started = time.monotonic()",
        "        try:",
        "            result = handler(*job.args, **job.kwargs)",
        "        except Exception as error:  # noqa: BLE001 - every failure is classified",
        "            self._failed(job, error)",
        "        else:",
        "            self.broker.ack(job, result=result, ttl=self.config.result_ttl)",
        '            metrics.jobs_total.labels(job.name, "ok").inc()',
        "        finally:",
        "            metrics.job_seconds.labels(job.name).observe(time.monotonic() - started)",
        "            with self._lock:",
        "                self._running.pop(job.id, None)",
        "",
        "    def _failed(self, job: Job, error: BaseException) -> None:",
        "        attempt = job.attempt + 1",
        "        if not self.policy.should_retry(attempt, error):",
        "            exhausted = RetryExhausted(job.id, attempt, error)",
        '            log.error("%s", exhausted)',
        "            self.broker.bury(job, self.config.dead_letter_queue, reason=reason(error))",
        '            metrics.jobs_total.labels(job.name, "dead").inc()',
        "            return",
        "        wait = self.policy.delay(attempt)",
        '        log.warning("job %s (%s) attempt %d: %s; retry in %.1fs", job.id, job.name, attempt, reason(error), wait)',
        "        self.broker.retry(job, delay=wait, attempt=attempt)",
        '        metrics.jobs_total.labels(job.name, "retry").inc()',
        "        metrics.retries_by_class.labels(classify(error)).inc()",
        "",
        "    def _renew_leases(self) -> None:",
        "        while not self._stopping.wait(self.config.heartbeat_interval):",
        "            with self._lock:",
        "                jobs = [job for job, _ in self._running.values()]",
        "            for job in jobs:",
        "                try:",
        "                    self.broker.renew(job, lease=self.config.visibility_timeout)",
        "                except Exception as error:  # noqa: BLE001 - logged, the job may be re-run",
        '                    log.warning("could not renew the lease of job %s: %s", job.id, error)',
        "",
        "",
        "# -- handlers registered by the example application ---------------------------",
        "",
    ]
    for i, name in enumerate(HANDLERS):
        words = name.replace("_", " ")
        out += [
            "",
            f"def {name}(ctx, *, tenant_id: str, item_id: str, dry_run: bool = False) -> dict:",
            f'    """Job handler: {words} for one item of a tenant.',
            "",
            "    Idempotent: running it twice for the same item changes nothing the second",
            "    time, which is what makes retries safe.",
            '    """',
            f"    item = ctx.store.get(\"{name.split('_')[-1]}\", tenant_id, item_id)",
            "    if item is None:",
            f"        raise KeyError(f\"{name}: no item {{item_id}} for tenant {{tenant_id}}\")",
            "    if dry_run:",
            f"        log.info(\"dry run of {name} for %s/%s\", tenant_id, item_id)",
            "        return {\"item\": item_id, \"changed\": False}",
            f"    with ctx.store.lock(tenant_id, item_id, timeout={5 + i}):",
            f"        changed = ctx.services.{name}(item)",
            "    ctx.audit.record(",
            f"        action=\"{name}\",",
            "        tenant=tenant_id,",
            "        item=item_id,",
            "        changed=changed,",
            "    )",
            "    return {\"item\": item_id, \"changed\": bool(changed)}",
        ]
    out += [
        "",
        "",
        "HANDLERS: dict[str, Handler] = {",
    ]
    out += [f'    "{name}": {name},' for name in HANDLERS]
    out += [
        "}",
        "",
        "",
        "def main(argv: list[str] | None = None) -> int:",
        '    """`python -m tinyq.worker [--config worker.toml]`."""',
        "    import argparse",
        "",
        "    from tinyq.broker import connect",
        "",
        '    parser = argparse.ArgumentParser(prog="tinyq-worker")',
        '    parser.add_argument("--config", type=Path, default=None)',
        "    args = parser.parse_args(argv)",
        "    config = WorkerConfig.load(args.config)",
        "    logging.basicConfig(level=config.log_level)",
        "    if config.metrics_port:",
        "        metrics.serve(config.metrics_port)",
        "    Worker(config, connect(config.broker_url), HANDLERS).run()",
        "    return 0",
        "",
        "",
        'if __name__ == "__main__":',
        "    raise SystemExit(main())",
        "",
    ]
    return "\n".join(out)


def readme_md(cls="Backoff", jitter=False):
    out = [
        "# tinyq",
        "",
        "A small, dependable job queue for Python services: Redis or AMQP as the broker,",
        "a thread-pool worker, leases with heartbeats, retries with exponential backoff,",
        "and a dead-letter queue for jobs that cannot succeed.",
        "",
        "## Install",
        "",
        "```",
        "pip install tinyq            # Redis broker",
        "pip install 'tinyq[amqp]'    # RabbitMQ broker",
        "```",
        "",
        "## Quick start",
        "",
        "```python",
        "from tinyq import Queue",
        "",
        'queue = Queue("redis://localhost:6379/0")',
        'queue.enqueue("send_invoice_email", tenant_id="acme", item_id="inv-1042")',
        "```",
        "",
        "Run a worker with the handlers of your application:",
        "",
        "```",
        "python -m tinyq.worker --config worker.toml",
        "```",
        "",
        "## Configuration",
        "",
        "Settings come from keyword arguments, then `TINYQ_*` environment variables, then",
        "the `[worker]` table of the TOML file given with `--config`, then the defaults.",
        "",
        "| setting | environment | default | meaning |",
        "|---|---|---|---|",
    ]
    fields = list(CONFIG_FIELDS)
    if jitter:
        fields.append(("retry_jitter", "float", "0.0", "Fraction of each retry delay drawn at random (0 = none, 1 = full jitter)."))
    for name, ty, default, doc in fields:
        out.append(f"| `{name}` | `TINYQ_{name.upper()}` | `{default.strip(chr(34))}` | {doc} |")
    out += [
        "",
        "## Retries",
        "",
        f"A job that raises is retried according to a `{cls}` policy built from the",
        "configuration: attempt *n* waits `base_delay * backoff_factor ** (n - 1)` seconds,",
        "never more than `max_delay`, for at most `max_attempts` attempts.",
        "",
        "```python",
        f"from tinyq.retry import {cls}",
        "",
        f"policy = {cls}(base_delay=1, factor=2, max_delay=30, max_attempts=6)",
        "list(policy.delays())   # [1, 2, 4, 8, 16]",
        "```",
        "",
    ]
    if jitter:
        out += [
            "With `retry_jitter` above 0 each delay is shortened by a random part of up to",
            "that fraction, so that many jobs failing together do not retry in lockstep.",
            "",
        ]
    out += [
        "Errors are classified by class name (and base classes):",
        "",
        "| error | retried | why |",
        "|---|---|---|",
    ]
    for name, ok, why in ERRORS:
        out.append(f"| `{name}` | {'yes' if ok else 'no'} | {why} |")
    out += [
        "",
        "Unknown errors are retried. A job that runs out of attempts, or raises a",
        "permanent error, is moved to the dead-letter queue with the reason.",
        "",
        "## Handlers",
        "",
        "A handler is a function taking a context and keyword arguments. Handlers must",
        "be idempotent: a retried job runs its handler again from the start.",
        "",
    ]
    for name in HANDLERS:
        out.append(f"- `{name}`: {name.replace('_', ' ')} for one item of a tenant.")
    out += [
        "",
        "## Operations",
        "",
        "- `SIGTERM` stops fetching and gives running jobs `shutdown_grace` seconds.",
        "- `metrics_port` serves Prometheus metrics: `tinyq_jobs_total{name,outcome}`,",
        "  `tinyq_job_seconds{name}`, `tinyq_retries_by_class{class}`.",
        "- Dead jobs stay in the dead-letter queue until `tinyq requeue` or `tinyq purge`.",
        "",
        "## License",
        "",
        "MIT",
        "",
    ]
    return "\n".join(out)


# --------------------------------------------------------------------------
# Tool output.
# --------------------------------------------------------------------------

def bash_result(code, output):
    return f"exit code: {code}\n{output}"


def pytest_header(collected):
    return [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.12.4, pytest-8.3.3, pluggy-1.5.0",
        "rootdir: /work/tinyq",
        "configfile: pyproject.toml",
        "plugins: cov-5.0.0, timeout-2.3.1",
        f"collected {collected} items",
        "",
    ]


def cap_failure():
    return [
        "",
        "=================================== FAILURES ===================================",
        "________________________ test_backoff_caps_at_max_delay ________________________",
        "",
        "    def test_backoff_caps_at_max_delay():",
        "        policy = Backoff(base_delay=1, factor=2, max_delay=30)",
        ">       assert policy.delay(10) == 30",
        "E       assert 512.0 == 30",
        "E        +  where 512.0 = delay(10)",
        "E        +    where delay = Backoff(base_delay=1, factor=2, max_delay=30, max_attempts=5).delay",
        "",
        "tests/test_retry.py:35: AssertionError",
        "=========================== short test summary info ============================",
        "FAILED tests/test_retry.py::test_backoff_caps_at_max_delay - assert 512.0 == 30",
    ]


def jitter_failure():
    return [
        "",
        "=================================== FAILURES ===================================",
        "____________________ test_retry_jitter_is_read_from_the_env ____________________",
        "",
        "    def test_retry_jitter_is_read_from_the_env():",
        '>       config = WorkerConfig.load(env={"TINYQ_RETRY_JITTER": "0.25"})',
        "E       NameError: name 'WorkerConfig' is not defined",
        "",
        "tests/test_retry.py:187: NameError",
        "=========================== short test summary info ============================",
        "FAILED tests/test_retry.py::test_retry_jitter_is_read_from_the_env - NameError: name 'WorkerConfig' is not defined",
    ]


def grep_backoff():
    rows = [
        "tinyq/retry.py:43:class Backoff:",
        "tinyq/retry.py:110:    def from_config(cls, config) -> \"Backoff\":",
        "tinyq/retry.py:178:    policy: Backoff,",
        "tinyq/retry.py:205:def schedule(policy: Backoff, failures: Iterable[float]) -> list[float]:",
        "tinyq/worker.py:15:from tinyq.retry import Backoff, RetryExhausted, classify, reason",
        "tinyq/worker.py:35:        self.policy = Backoff.from_config(config)",
        "tinyq/__init__.py:9:from tinyq.retry import Backoff, RetryExhausted",
        "tinyq/__init__.py:21:    \"Backoff\",",
        "tinyq/queue.py:12:from tinyq.retry import Backoff",
        "tinyq/queue.py:88:        retry: Backoff | None = None,",
        "tinyq/queue.py:97:            retry: per-job override of the worker's Backoff policy.",
        "README.md:64:A job that raises is retried according to a `Backoff` policy built from the",
        "README.md:70:from tinyq.retry import Backoff",
        "README.md:72:policy = Backoff(base_delay=1, factor=2, max_delay=30, max_attempts=6)",
        "docs/retries.md:3:`Backoff` decides when a failed job runs again.",
        "docs/retries.md:27:    Backoff(base_delay=0.5, factor=3, max_delay=60)",
        "CHANGELOG.md:41:- `Backoff.total_delay()` gives the worst-case wait of a job.",
    ]
    test_lines = [
        "tests/test_retry.py:6:from tinyq.retry import Backoff, RetryExhausted, classify, reason, retry_call, schedule",
        "tests/test_retry.py:25:    assert Backoff(base_delay=0.5).delay(1) == 0.5",
        "tests/test_retry.py:29:    policy = Backoff(base_delay=1, factor=3, max_delay=1000)",
        "tests/test_retry.py:34:    policy = Backoff(base_delay=1, factor=2, max_delay=30)",
        "tests/test_retry.py:39:    policy = Backoff(base_delay=1, factor=2, max_delay=100, max_attempts=4)",
        "tests/test_retry.py:46:        Backoff().delay(attempt)",
        "tests/test_retry.py:58:        Backoff(**kwargs)",
    ]
    for i in range(8):
        test_lines.append(f"tests/test_retry.py:{140 + 7 * i}:    assert retry_call(flaky, Backoff(max_attempts={3 + i}), sleep=slept.append) == \"done\"")
    for i in range(14):
        test_lines.append(f"tests/test_worker.py:{30 + 11 * i}:    worker = make_worker(policy=Backoff(base_delay=0, max_attempts={2 + i % 4}))")
    for i in range(6):
        test_lines.append(f"tests/test_queue.py:{44 + 9 * i}:    job = queue.enqueue(\"{HANDLERS[i]}\", retry=Backoff(max_attempts={i + 1}), tenant_id=\"t\", item_id=\"{i}\")")
    return "\n".join(rows + test_lines)


def queue_py():
    out = [
        '"""The producer side: enqueue jobs, look up their status and results."""',
        "",
        "from __future__ import annotations",
        "",
        "import dataclasses",
        "import json",
        "import time",
        "import uuid",
        "from typing import Any",
        "",
        "from tinyq.broker import Broker, connect",
        "from tinyq.retry import Backoff",
        "",
        'STATUSES = ("queued", "running", "retrying", "done", "dead", "cancelled")',
        "",
        "",
        "@dataclasses.dataclass(frozen=True)",
        "class JobHandle:",
        '    """What `enqueue` returns: enough to follow the job."""',
        "",
        "    id: str",
        "    name: str",
        "    queue: str",
        "    enqueued_at: float",
        "",
        "",
        "class Queue:",
        '    """A named queue on a broker."""',
        "",
        '    def __init__(self, broker_url: str, name: str = "default", *, broker: Broker | None = None):',
        "        self.name = name",
        "        self.broker = broker or connect(broker_url)",
        "",
    ]
    for i, handler in enumerate(HANDLERS):
        out += [
            f"    def enqueue_{handler}(self, tenant_id: str, item_id: str, *, delay: float = 0.0, retry: Backoff | None = None) -> JobHandle:",
            f'        """Enqueues `{handler}` for one item (a typed shortcut for `enqueue`)."""',
            f'        return self.enqueue("{handler}", tenant_id=tenant_id, item_id=item_id, delay=delay, retry=retry)',
            "",
        ]
    out += [
        "    def enqueue(",
        "        self,",
        "        name: str,",
        "        *args: Any,",
        "        delay: float = 0.0,",
        "        retry: Backoff | None = None,",
        "        **kwargs: Any,",
        "    ) -> JobHandle:",
        '        """Puts a job on the queue.',
        "",
        "        Args:",
        "            name: the handler's registered name.",
        "            delay: seconds before the job becomes visible.",
        "            retry: per-job override of the worker's Backoff policy.",
        '        """',
        "        job_id = uuid.uuid4().hex",
        "        payload = {",
        '            "id": job_id,',
        '            "name": name,',
        '            "args": list(args),',
        '            "kwargs": kwargs,',
        '            "attempt": 0,',
        "        }",
        "        if retry is not None:",
        '            payload["retry"] = dataclasses.asdict(retry)',
        "        try:",
        "            body = json.dumps(payload)",
        "        except TypeError as error:",
        '            raise ValueError(f"job {name}: arguments are not JSON-serializable: {error}") from error',
        "        self.broker.put(self.name, job_id, body, delay=delay)",
        "        return JobHandle(job_id, name, self.name, time.time())",
        "",
        "    def status(self, job_id: str) -> str:",
        '        """One of STATUSES."""',
        "        status = self.broker.status(self.name, job_id)",
        "        if status not in STATUSES:",
        '            raise RuntimeError(f"broker returned unknown status {status!r} for {job_id}")',
        "        return status",
        "",
        "    def result(self, job_id: str, timeout: float = 0.0) -> Any:",
        '        """The job\'s return value, waiting up to `timeout` seconds."""',
        "        deadline = time.monotonic() + timeout",
        "        while True:",
        "            status = self.status(job_id)",
        '            if status == "done":',
        "                return json.loads(self.broker.result(self.name, job_id))",
        '            if status in ("dead", "cancelled"):',
        '                raise LookupError(f"job {job_id} is {status}")',
        "            if time.monotonic() >= deadline:",
        '                raise TimeoutError(f"job {job_id} still {status} after {timeout}s")',
        "            time.sleep(0.05)",
        "",
        "    def cancel(self, job_id: str) -> bool:",
        '        """Cancels a job that has not started; False if it already ran."""',
        "        return self.broker.cancel(self.name, job_id)",
        "",
        "    def __len__(self) -> int:",
        "        return self.broker.size(self.name)",
        "",
    ]
    return "\n".join(out)

BROKER_OPS = [
    ("put", "queue: str, job_id: str, body: str, *, delay: float = 0.0", "Adds a job, visible after `delay` seconds.",
     ["score = self._now() + delay", "self._call(\"ZADD\", self._key(queue, \"scheduled\"), {job_id: score})", "self._call(\"HSET\", self._key(queue, \"jobs\"), job_id, body)", "self._call(\"HSET\", self._key(queue, \"status\"), job_id, \"queued\")"]),
    ("fetch", "queue: str, *, limit: int, lease: float", "Takes up to `limit` due jobs and leases them for `lease` seconds.",
     ["now = self._now()", "ids = self._script(\"fetch_due\", keys=[self._key(queue, \"scheduled\"), self._key(queue, \"leased\")], args=[now, limit, now + lease])", "bodies = self._call(\"HMGET\", self._key(queue, \"jobs\"), *ids) if ids else []", "jobs = [Job.decode(queue, body) for body in bodies if body is not None]", "for job in jobs:", "    self._call(\"HSET\", self._key(queue, \"status\"), job.id, \"running\")", "return jobs"]),
    ("renew", "job: Job, *, lease: float", "Extends the lease of a running job.",
     ["renewed = self._call(\"ZADD\", self._key(job.queue, \"leased\"), {job.id: self._now() + lease}, xx=True)", "if not renewed:", "    raise LeaseExpired(f\"job {job.id} lost its lease\")"]),
    ("ack", "job: Job, *, result: object, ttl: float", "Marks a job done and stores its result for `ttl` seconds.",
     ["pipe = self._pipeline()", "pipe.zrem(self._key(job.queue, \"leased\"), job.id)", "pipe.hdel(self._key(job.queue, \"jobs\"), job.id)", "pipe.hset(self._key(job.queue, \"status\"), job.id, \"done\")", "pipe.set(self._key(job.queue, \"result\", job.id), json.dumps(result), ex=int(ttl))", "pipe.execute()"]),
    ("retry", "job: Job, *, delay: float, attempt: int", "Puts a failed job back, visible after `delay` seconds.",
     ["body = job.with_attempt(attempt).encode()", "pipe = self._pipeline()", "pipe.zrem(self._key(job.queue, \"leased\"), job.id)", "pipe.hset(self._key(job.queue, \"jobs\"), job.id, body)", "pipe.zadd(self._key(job.queue, \"scheduled\"), {job.id: self._now() + delay})", "pipe.hset(self._key(job.queue, \"status\"), job.id, \"retrying\")", "pipe.execute()"]),
    ("bury", "job: Job, dead_letter_queue: str, *, reason: str", "Moves a job to the dead-letter queue with the reason.",
     ["pipe = self._pipeline()", "pipe.zrem(self._key(job.queue, \"leased\"), job.id)", "pipe.hdel(self._key(job.queue, \"jobs\"), job.id)", "pipe.hset(self._key(dead_letter_queue, \"jobs\"), job.id, job.encode())", "pipe.hset(self._key(dead_letter_queue, \"reasons\"), job.id, reason)", "pipe.hset(self._key(job.queue, \"status\"), job.id, \"dead\")", "pipe.execute()"]),
    ("release", "job: Job", "Gives a leased job back unchanged (worker shutdown).",
     ["pipe = self._pipeline()", "pipe.zrem(self._key(job.queue, \"leased\"), job.id)", "pipe.zadd(self._key(job.queue, \"scheduled\"), {job.id: self._now()})", "pipe.hset(self._key(job.queue, \"status\"), job.id, \"queued\")", "pipe.execute()"]),
    ("cancel", "queue: str, job_id: str", "Cancels a job that has not started.",
     ["removed = self._call(\"ZREM\", self._key(queue, \"scheduled\"), job_id)", "if removed:", "    self._call(\"HSET\", self._key(queue, \"status\"), job_id, \"cancelled\")", "return bool(removed)"]),
    ("status", "queue: str, job_id: str", "The job's status string.",
     ["value = self._call(\"HGET\", self._key(queue, \"status\"), job_id)", "return value.decode() if value else \"unknown\""]),
    ("result", "queue: str, job_id: str", "The stored result (JSON text).",
     ["value = self._call(\"GET\", self._key(queue, \"result\", job_id))", "if value is None:", "    raise LookupError(f\"no result for {job_id} (expired or never stored)\")", "return value.decode()"]),
    ("size", "queue: str", "Jobs waiting or scheduled.",
     ["return int(self._call(\"ZCARD\", self._key(queue, \"scheduled\")))"]),
    ("requeue_dead", "dead_letter_queue: str, queue: str, *, limit: int = 100", "Moves buried jobs back to a queue (`tinyq requeue`).",
     ["ids = self._call(\"HKEYS\", self._key(dead_letter_queue, \"jobs\"))[:limit]", "for raw in ids:", "    job_id = raw.decode()", "    body = self._call(\"HGET\", self._key(dead_letter_queue, \"jobs\"), job_id)", "    self.put(queue, job_id, Job.decode(queue, body).with_attempt(0).encode())", "    self._call(\"HDEL\", self._key(dead_letter_queue, \"jobs\"), job_id)", "return len(ids)"]),
    ("purge_dead", "dead_letter_queue: str", "Deletes every buried job (`tinyq purge`).",
     ["n = self._call(\"HLEN\", self._key(dead_letter_queue, \"jobs\"))", "self._call(\"DEL\", self._key(dead_letter_queue, \"jobs\"), self._key(dead_letter_queue, \"reasons\"))", "return int(n)"]),
]


def broker_py():
    out = [
        '"""Brokers: where jobs wait. Redis is built in; AMQP lives in tinyq.amqp."""',
        "",
        "from __future__ import annotations",
        "",
        "import dataclasses",
        "import json",
        "import logging",
        "import time",
        "from typing import Any, Protocol",
        "",
        "from tinyq.errors import BrokerUnavailable, ConfigError, LeaseExpired",
        "",
        "log = logging.getLogger(__name__)",
        "",
        "",
        "@dataclasses.dataclass(frozen=True)",
        "class Job:",
        '    """A job as the broker stores it."""',
        "",
        "    queue: str",
        "    id: str",
        "    name: str",
        "    args: tuple = ()",
        "    kwargs: dict = dataclasses.field(default_factory=dict)",
        "    attempt: int = 0",
        "    retry: dict | None = None",
        "",
        "    @classmethod",
        '    def decode(cls, queue: str, body: bytes | str) -> "Job":',
        "        data = json.loads(body)",
        "        return cls(queue, data[\"id\"], data[\"name\"], tuple(data.get(\"args\", ())), data.get(\"kwargs\", {}),",
        "                   data.get(\"attempt\", 0), data.get(\"retry\"))",
        "",
        "    def encode(self) -> str:",
        "        return json.dumps({\"id\": self.id, \"name\": self.name, \"args\": list(self.args), \"kwargs\": self.kwargs,",
        "                           \"attempt\": self.attempt, \"retry\": self.retry})",
        "",
        '    def with_attempt(self, attempt: int) -> "Job":',
        "        return dataclasses.replace(self, attempt=attempt)",
        "",
        "",
        "class Broker(Protocol):",
        '    """What a worker and a queue need from a broker."""',
        "",
    ]
    for name, params, doc, body in BROKER_OPS:
        out += [f"    def {name}(self, {params}) -> Any:", f'        """{doc}"""', "        ...", ""]
    out += [
        "",
        "class RedisBroker:",
        '    """Redis: a sorted set of scheduled ids per queue (score = due time), a',
        "    sorted set of leased ids (score = lease end), hashes for bodies and",
        "    statuses. Due jobs are taken atomically by a Lua script.",
        '    """',
        "",
        "    SCRIPTS = {",
        '        "fetch_due": """',
        "            local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])",
        "            for _, id in ipairs(due) do",
        "                redis.call('ZREM', KEYS[1], id)",
        "                redis.call('ZADD', KEYS[2], ARGV[3], id)",
        "            end",
        "            return due",
        '        """,',
        '        "reap_expired": """',
        "            local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])",
        "            for _, id in ipairs(expired) do",
        "                redis.call('ZREM', KEYS[1], id)",
        "                redis.call('ZADD', KEYS[2], ARGV[1], id)",
        "            end",
        "            return #expired",
        '        """,',
        "    }",
        "",
        "    def __init__(self, client, *, prefix: str = \"tinyq\", clock=time.time):",
        "        self.client = client",
        "        self.prefix = prefix",
        "        self._now = clock",
        "        self._scripts = {name: client.register_script(src) for name, src in self.SCRIPTS.items()}",
        "",
        "    def _key(self, *parts: str) -> str:",
        '        return ":".join((self.prefix, *parts))',
        "",
        "    def _call(self, command: str, *args, **kwargs):",
        "        try:",
        "            return self.client.execute_command(command, *args, **kwargs)",
        "        except (ConnectionError, TimeoutError) as error:",
        '            raise BrokerUnavailable(f"redis {command} failed: {error}") from error',
        "",
        "    def _pipeline(self):",
        "        return self.client.pipeline(transaction=True)",
        "",
        "    def _script(self, name: str, *, keys: list[str], args: list[Any]) -> list[str]:",
        "        try:",
        "            return [raw.decode() for raw in self._scripts[name](keys=keys, args=args)]",
        "        except (ConnectionError, TimeoutError) as error:",
        '            raise BrokerUnavailable(f"redis script {name} failed: {error}") from error',
        "",
    ]
    for name, params, doc, body in BROKER_OPS:
        out += [f"    def {name}(self, {params}) -> Any:", f'        """{doc}"""']
        out += ["        " + line for line in body]
        out.append("")
    out += [
        "    def reap_expired_leases(self, queue: str) -> int:",
        '        """Puts jobs whose lease ran out (a dead worker) back on the queue."""',
        "        n = self._script(\"reap_expired\", keys=[self._key(queue, \"leased\"), self._key(queue, \"scheduled\")], args=[self._now()])",
        "        if n:",
        '            log.warning("%d job(s) of %s had an expired lease and were re-queued", n, queue)',
        "        return n",
        "",
        "",
        "def connect(url: str, **kwargs) -> Broker:",
        '    """A broker for `url`: redis://, rediss:// or (with tinyq[amqp]) amqp://."""',
        '    if url.startswith(("redis://", "rediss://")):',
        "        import redis",
        "",
        "        return RedisBroker(redis.Redis.from_url(url, socket_timeout=kwargs.pop(\"socket_timeout\", 5.0)), **kwargs)",
        '    if url.startswith(("amqp://", "amqps://")):',
        "        try:",
        "            from tinyq.amqp import AmqpBroker",
        "        except ImportError as error:",
        "            raise ConfigError(\"broker_url\", \"amqp:// needs `pip install 'tinyq[amqp]'`\") from error",
        "        return AmqpBroker(url, **kwargs)",
        '    raise ConfigError("broker_url", f"unsupported scheme in {url!r}")',
        "",
    ]
    return "\n".join(out)


def test_worker_py():
    out = [
        '"""Tests of tinyq.worker with an in-memory broker."""',
        "",
        "import pytest",
        "",
        "from tinyq import errors",
        "from tinyq.broker import Job",
        "from tinyq.config import WorkerConfig",
        "from tinyq.retry import Backoff",
        "from tinyq.worker import Worker",
        "",
        "from .fakes import FakeBroker, FakeClock",
        "",
        "",
        "def make_worker(policy=None, handlers=None, **config):",
        '    broker = FakeBroker(clock=FakeClock())',
        '    worker = Worker(WorkerConfig(**config), broker, handlers or {})',
        "    if policy is not None:",
        "        worker.policy = policy",
        "    return worker, broker",
        "",
        "",
        "def job(name=\"h\", attempt=0, **kwargs):",
        "    return Job(\"default\", f\"{name}-{attempt}\", name, (), kwargs, attempt)",
        "",
    ]
    cases = [(name, ok) for name, ok, _ in ERRORS]
    for i, (name, ok) in enumerate(cases):
        snake = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
        make = f"{name}()" if name in ("ConnectionResetError", "ConnectionRefusedError", "TimeoutError", "BrokenPipeError", "PermissionError", "ValueError", "KeyError", "MemoryError") else f"errors.{name}()"
        out += [
            "",
            f"def test_{snake}_is_{'retried' if ok else 'buried'}():",
            "    def handler():",
            f"        raise {make}",
            "",
            f"    worker, broker = make_worker(policy=Backoff(base_delay=0, max_attempts={2 + i % 4}), handlers={{\"h\": handler}})",
            "    worker._run(job(), handler)",
        ]
        if ok:
            out += [
                "    assert broker.retried == [(\"h-0\", 0.0, 1)]",
                "    assert broker.buried == []",
            ]
        else:
            out += [
                "    assert broker.retried == []",
                f"    assert broker.buried[0][0] == \"h-0\" and \"{name}\" in broker.buried[0][2]",
            ]
    out += [
        "",
        "",
        "def test_last_attempt_is_buried_with_the_reason():",
        "    def handler():",
        "        raise TimeoutError(\"slow\")",
        "",
        "    worker, broker = make_worker(policy=Backoff(base_delay=0, max_attempts=3), handlers={\"h\": handler})",
        "    worker._run(job(attempt=2), handler)",
        "    assert broker.buried == [(\"h-2\", \"dead\", \"TimeoutError: no acknowledgement within the visibility timeout (will retry)\")]",
        "",
        "",
        "def test_unknown_handler_is_buried_without_running():",
        "    worker, broker = make_worker()",
        "    worker._submit(job(name=\"missing\"))",
        "    assert broker.buried == [(\"missing-0\", \"dead\", \"no handler\")]",
        "",
        "",
        '@pytest.mark.parametrize("concurrency, prefetch", [(1, 1), (4, 8), (8, 8)])',
        "def test_fetch_respects_prefetch(concurrency, prefetch):",
        "    worker, broker = make_worker(concurrency=concurrency, prefetch=prefetch)",
        "    for i in range(20):",
        "        broker.put(\"default\", f\"j{i}\", job(attempt=i).encode())",
        "    worker.stop()",
        "    assert broker.max_fetch_limit <= prefetch",
        "",
    ]
    return "\n".join(out)


def test_names(stage):
    """Every test id by file: stage 0 before the session's changes, 1 with the
    jitter tests, 2 with the alias test too."""
    names = {
        "tests/test_broker.py": [f"test_{op}_{case}" for op, *_ in BROKER_OPS for case in ("roundtrip", "unavailable")],
        "tests/test_config.py": [f"test_{name}_{case}" for name, *_ in CONFIG_FIELDS for case in ("default", "from_env")][:42],
        "tests/test_queue.py": [f"test_enqueue_{h}" for h in HANDLERS] + [f"test_{x}" for x in ("status_unknown", "result_timeout", "result_dead", "cancel_started", "cancel_queued", "len", "json_error", "delay", "retry_override", "handle_fields", "typed_shortcuts", "dead_lookup", "ttl", "statuses", "broker_url")],
        "tests/test_retry.py": [],
        "tests/test_worker.py": [],
    }
    retry_names = ["test_first_delay_is_base_delay", "test_delays_grow_by_factor", "test_backoff_caps_at_max_delay", "test_total_delay_counts_every_wait", "test_attempts_count_from_one[0]", "test_attempts_count_from_one[-1]"]
    retry_names += [f"test_invalid_policies_are_rejected[kwargs{i}]" for i in range(4)]
    for name, ok, _ in ERRORS:
        snake = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
        retry_names.append(f"test_{snake}_is_{'transient' if ok else 'permanent'}")
        names["tests/test_worker.py"].append(f"test_{snake}_is_{'retried' if ok else 'buried'}")
    retry_names += ["test_retry_call_retries_transient_errors", "test_retry_call_gives_up_on_permanent_errors", "test_retry_call_stops_after_max_attempts", "test_schedule_adds_run_time_and_delay"]
    if stage >= 1:
        retry_names += [f"test_jitter_shortens_the_delay_by_up_to_its_fraction[{d}-{e}]" for d, e in (("0.0", "6.0"), ("0.5", "7.0"), ("1.0", "8.0"))]
        retry_names += ["test_no_jitter_by_default", "test_jitter_outside_unit_interval_is_rejected[-0.1]", "test_jitter_outside_unit_interval_is_rejected[1.5]", "test_retry_jitter_is_read_from_the_env"]
    if stage >= 2:
        retry_names += ["test_backoff_is_a_deprecated_alias"]
    names["tests/test_retry.py"] = retry_names
    names["tests/test_worker.py"] += ["test_last_attempt_is_buried_with_the_reason", "test_unknown_handler_is_buried_without_running"] + [f"test_fetch_respects_prefetch[{c}-{p}]" for c, p in ((1, 1), (4, 8), (8, 8))]
    return names


def test_count(stage, file=None):
    names = test_names(stage)
    return len(names[file]) if file else sum(len(v) for v in names.values())


def pytest_run(stage, total_secs):
    """A passing `pytest -q` of the whole suite."""
    names = test_names(stage)
    collected = test_count(stage)
    out = pytest_header(collected)
    done = 0
    for f, tests in names.items():
        done += len(tests)
        out.append(f"{f} {'.' * len(tests):<50} [{100 * done // collected:3d}%]")
    out += ["", f"============================== {collected} passed in {total_secs} =============================="]
    return "\n".join(out)


def pytest_verbose(stage):
    """A passing `pytest -v` of the whole suite."""
    rows = [f"{f}::{t}" for f, ts in test_names(stage).items() for t in ts]
    out = pytest_header(len(rows))
    for i, row in enumerate(rows, start=1):
        out.append(f"{row} PASSED{' ' * max(1, 100 - len(row))}[{100 * i // len(rows):3d}%]")
    out += ["", f"============================== {len(rows)} passed in 4.11s =============================="]
    return "\n".join(out)


# --------------------------------------------------------------------------
# The session.
# --------------------------------------------------------------------------

class Session:
    def __init__(self):
        self.messages = [{"role": "system", "content": SYSTEM}]
        self.n = 0

    def user(self, text):
        self.messages.append({"role": "user", "content": text})

    def say(self, text):
        self.messages.append({"role": "assistant", "content": text})

    def call(self, text, name, args, result):
        """One assistant turn with one tool call and its result."""
        self.calls(text, [(name, args, result)])

    def calls(self, text, items):
        ids = []
        tool_calls = []
        for name, args, _ in items:
            self.n += 1
            cid = f"call_{self.n:03d}"
            ids.append(cid)
            tool_calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}})
        self.messages.append({"role": "assistant", "content": text, "tool_calls": tool_calls})
        for cid, (_, _, result) in zip(ids, items):
            self.messages.append({"role": "tool", "tool_call_id": cid, "content": result})


def diff(path, hunks):
    out = [f"diff --git a/{path} b/{path}", "index 3f2a9c1..8be04d7 100644", f"--- a/{path}", f"+++ b/{path}"]
    for header, lines in hunks:
        out.append(header)
        out += lines
    return out


def build():
    s = Session()
    bash = "bash"

    # Ask 1: a failing test.
    s.user(
        "CI is red on main: `tests/test_retry.py::test_backoff_caps_at_max_delay` fails. "
        "Please find out why and fix it. Don't change the test unless it is wrong."
    )
    s.call("Let me look at the layout of the repository first.", bash, {"command": "cd /work/tinyq && git status --short && ls -R tinyq tests | head -60"},
           bash_result(0, "tinyq:\n__init__.py\nbroker.py\nconfig.py\nerrors.py\nmetrics.py\nqueue.py\nretry.py\nworker.py\n\ntests:\nconftest.py\ntest_broker.py\ntest_config.py\ntest_queue.py\ntest_retry.py\ntest_worker.py"))
    s.call(None, bash, {"command": "cd /work/tinyq && python -m pytest -q tests/test_retry.py -x 2>&1 | tail -30"},
           bash_result(1, "\n".join(["..F"] + cap_failure()[1:] + ["1 failed, 2 passed in 0.21s"])))
    s.call("The delay is not capped: 1 * 2**9 = 512 instead of 30. Let me read the policy.", "read_file", {"path": "tinyq/retry.py"},
           numbered(retry_py()))
    s.call("And the test file, to check the test's expectation is right.", "read_file", {"path": "tests/test_retry.py"},
           numbered(test_retry_py()))
    s.call(
        "The test is right: the docstring says a delay is never more than `max_delay`. The bug is in `delay()`: it caps "
        "`base_delay` *before* multiplying by `factor ** (attempt - 1)`, so only the first delay is ever capped. "
        "The cap must apply to the product.",
        "str_replace",
        {"path": "tinyq/retry.py",
         "old": "        capped_base = min(self.base_delay, self.max_delay)\n        delay = capped_base * self.factor ** (attempt - 1)",
         "new": "        raw = self.base_delay * self.factor ** (attempt - 1)\n        delay = min(raw, self.max_delay)"},
        "Replaced 1 occurrence in tinyq/retry.py (lines 97-98).")
    s.call(None, bash, {"command": "cd /work/tinyq && python -m pytest -q"}, bash_result(0, pytest_run(0, "3.91s")))
    s.call("All green. Here is the change:", bash, {"command": "cd /work/tinyq && git diff"},
           bash_result(0, "\n".join(diff("tinyq/retry.py", [("@@ -94,8 +94,8 @@ class Backoff:", [
               '         """Seconds to wait before retry number `attempt` (from 1)."""',
               "         if attempt < 1:",
               '             raise ValueError(f"attempt must be >= 1, got {attempt}")',
               "-        capped_base = min(self.base_delay, self.max_delay)",
               "-        delay = capped_base * self.factor ** (attempt - 1)",
               "+        raw = self.base_delay * self.factor ** (attempt - 1)",
               "+        delay = min(raw, self.max_delay)",
               "         return delay",
               " ",
               "     def delays(self) -> Iterator[float]:"])]))))
    s.say(
        "Fixed. `Backoff.delay()` capped `base_delay` before multiplying by `factor ** (attempt - 1)`, so every delay "
        "after the first could exceed `max_delay` (attempt 10 waited 512 s instead of 30 s). It now caps the product "
        "(tinyq/retry.py:97-98). The test was correct and is unchanged; "
        f"the full suite passes ({test_count(0)} tests)."
    )

    # Ask 2: a feature.
    s.user(
        "Thanks. Next: when the broker restarts, hundreds of jobs fail at once and then all retry at exactly the same "
        "moments, which hammers it again. Add optional jitter to the retry delay: a `retry_jitter` setting in "
        "WorkerConfig (0 = off, the default; 1 = full jitter), read from TOML and TINYQ_RETRY_JITTER like the others, "
        "used by the retry policy. Add tests."
    )
    s.call("I'll read the configuration module to add the setting the same way as the others.", "read_file", {"path": "tinyq/config.py"},
           numbered(config_py()))
    s.call("Let me also check how the producer side passes per-job policies, since a job can carry its own Backoff.", "read_file", {"path": "tinyq/queue.py"},
           numbered(queue_py()))
    s.call("And how the broker re-enqueues a failed job with the delay, since jitter must not break the lease handling.", "read_file", {"path": "tinyq/broker.py"},
           numbered(broker_py()))
    s.call(
        "`retry()` takes the delay as given and schedules the job at now + delay, so jitter belongs entirely in the policy. "
        "Per-job policies are serialized with `dataclasses.asdict`, so a new field with a default keeps old payloads "
        "loadable. First the setting:",
        "str_replace",
        {"path": "tinyq/config.py",
         "old": '    max_delay: float = 300.0\n    """No retry waits longer than this, in seconds."""',
         "new": '    max_delay: float = 300.0\n    """No retry waits longer than this, in seconds."""\n    retry_jitter: float = 0.0\n    """Fraction of each retry delay drawn at random (0 = none, 1 = full jitter)."""'},
        "Replaced 1 occurrence in tinyq/config.py (lines 35-36).")
    s.call(None, "str_replace",
           {"path": "tinyq/config.py",
            "old": "        _check_max_delay(self.max_delay)",
            "new": "        _check_max_delay(self.max_delay)\n        _check_retry_jitter(self.retry_jitter)"},
           "Replaced 1 occurrence in tinyq/config.py (line 51).")
    s.call(None, bash,
           {"command": "cd /work/tinyq && cat >> tinyq/config.py <<'EOF'\n\n\ndef _check_retry_jitter(value: float) -> None:\n    \"\"\"Fraction of each retry delay drawn at random.\"\"\"\n    if not 0.0 <= value <= 1.0:\n        raise ConfigError(\"retry_jitter\", f\"must be within [0, 1], got {value}\")\nEOF\ntail -5 tinyq/config.py"},
           bash_result(0, 'def _check_retry_jitter(value: float) -> None:\n    """Fraction of each retry delay drawn at random."""\n    if not 0.0 <= value <= 1.0:\n        raise ConfigError("retry_jitter", f"must be within [0, 1], got {value}")'))
    s.call("Now the policy: a `jitter` field, validated, applied after the cap, with an injectable random source for tests.",
           "write_file", {"path": "tinyq/retry.py", "content": retry_py(fixed=True, jitter=True)},
           f"Wrote {len(retry_py(fixed=True, jitter=True).encode())} bytes to tinyq/retry.py.")
    jitter_tests = "\n".join([
        "",
        "",
        "class FixedRandom:",
        "    def __init__(self, value):",
        "        self.value = value",
        "",
        "    def random(self):",
        "        return self.value",
        "",
        "",
        '@pytest.mark.parametrize("draw, expected", [(0.0, 6.0), (0.5, 7.0), (1.0, 8.0)])',
        "def test_jitter_shortens_the_delay_by_up_to_its_fraction(draw, expected):",
        "    policy = Backoff(base_delay=1, factor=2, max_delay=100, jitter=0.25)",
        "    assert policy.delay(4, rng=FixedRandom(draw)) == pytest.approx(expected)",
        "",
        "",
        "def test_no_jitter_by_default():",
        "    assert Backoff().delay(3, rng=FixedRandom(0.0)) == 4.0",
        "",
        "",
        '@pytest.mark.parametrize("jitter", [-0.1, 1.5])',
        "def test_jitter_outside_unit_interval_is_rejected(jitter):",
        "    with pytest.raises(ValueError):",
        "        Backoff(jitter=jitter)",
        "",
        "",
        "def test_retry_jitter_is_read_from_the_env():",
        '    config = WorkerConfig.load(env={"TINYQ_RETRY_JITTER": "0.25"})',
        "    assert Backoff.from_config(config).jitter == 0.25",
        "",
    ])
    s.call("Tests for the jitter and for reading the setting:", bash,
           {"command": "cd /work/tinyq && cat >> tests/test_retry.py <<'EOF'" + jitter_tests + "EOF\npython -m pytest -q tests/test_retry.py 2>&1 | tail -40"},
           bash_result(1, "\n".join(["." * (test_count(1, "tests/test_retry.py") - 1) + "F"] + jitter_failure()[1:] + [f"1 failed, {test_count(1, 'tests/test_retry.py') - 1} passed in 0.34s"])))
    s.call("The new test uses `WorkerConfig`, which the test module does not import yet.", "str_replace",
           {"path": "tests/test_retry.py", "old": "from tinyq import errors\n", "new": "from tinyq import errors\nfrom tinyq.config import WorkerConfig\n"},
           "Replaced 1 occurrence in tests/test_retry.py (line 5).")
    s.call(None, bash, {"command": "cd /work/tinyq && python -m pytest -q"}, bash_result(0, pytest_run(1, "4.02s")))
    s.call(None, bash, {"command": "cd /work/tinyq && git diff --stat"},
           bash_result(0, " tinyq/config.py     |  9 +++++++\n tinyq/retry.py      | 16 +++++++++++++---\n tests/test_retry.py | 31 +++++++++++++++++++++++++++++++\n 3 files changed, 53 insertions(+), 3 deletions(-)"))
    s.say(
        "Added jitter. `WorkerConfig.retry_jitter` (default 0.0, validated to [0, 1], read from TOML and "
        "`TINYQ_RETRY_JITTER`) feeds `Backoff(jitter=...)`; `Backoff.delay(attempt, rng=None)` takes away a random "
        "part of up to `jitter * delay` after the cap, so delays never exceed `max_delay`. "
        f"{test_count(1) - test_count(0)} new tests in "
        "tests/test_retry.py (fixed random source, default off, bounds, env); the first run failed only because the "
        f"test module lacked the `WorkerConfig` import, now added. All {test_count(1)} tests pass."
    )

    # Ask 3: a rename.
    s.user(
        "Now that it does more than exponential backoff, please rename the `Backoff` class to `RetryPolicy` across the "
        "codebase and tests. Keep `Backoff` importable as a deprecated alias for one release (it should warn)."
    )
    s.call("Let me find every use first.", bash, {"command": "cd /work/tinyq && grep -rn \"Backoff\" --include=*.py --include=*.md ."},
           bash_result(0, grep_backoff()))
    s.call("The worker uses it in two places; let me read it before editing.", "read_file", {"path": "tinyq/worker.py"},
           numbered(worker_py()))
    s.call("The worker tests construct policies directly; let me read them too.", "read_file", {"path": "tests/test_worker.py"},
           numbered(test_worker_py()))
    s.call("I'll rename in the code with sed on word boundaries, leaving the docs for the next step, and check what is left.", bash,
           {"command": "cd /work/tinyq && sed -i 's/\\bBackoff\\b/RetryPolicy/g' tinyq/retry.py tinyq/worker.py tinyq/queue.py tinyq/__init__.py tests/*.py && grep -rn \"Backoff\" tinyq tests"},
           bash_result(0, 'tinyq/queue.py:97:            retry: per-job override of the worker\'s RetryPolicy policy.'))
    s.call("That docstring now reads oddly; fix the wording.", "str_replace",
           {"path": "tinyq/queue.py", "old": "per-job override of the worker's RetryPolicy policy.", "new": "per-job override of the worker's RetryPolicy."},
           "Replaced 1 occurrence in tinyq/queue.py (line 97).")
    s.call("Now the deprecated alias: a module `__getattr__` so that importing `Backoff` warns once per use site.", "str_replace",
           {"path": "tinyq/retry.py",
            "old": "def classify(error: BaseException) -> str:",
            "new": "def __getattr__(name: str):\n    # Deprecated alias, removed in 0.9.\n    if name == \"Backoff\":\n        import warnings\n\n        warnings.warn(\"tinyq.retry.Backoff is deprecated; use RetryPolicy\", DeprecationWarning, stacklevel=2)\n        return RetryPolicy\n    raise AttributeError(f\"module {__name__!r} has no attribute {name!r}\")\n\n\ndef classify(error: BaseException) -> str:"},
           "Replaced 1 occurrence in tinyq/retry.py (line 131).")
    s.call(None, "str_replace",
           {"path": "tinyq/__init__.py",
            "old": "from tinyq.retry import RetryPolicy, RetryExhausted",
            "new": "from tinyq.retry import RetryExhausted, RetryPolicy\n\n\ndef __getattr__(name: str):\n    if name == \"Backoff\":\n        from tinyq import retry\n\n        return retry.Backoff  # warns\n    raise AttributeError(f\"module {__name__!r} has no attribute {name!r}\")"},
           "Replaced 1 occurrence in tinyq/__init__.py (line 9).")
    s.call("A test that the alias still works and warns:", bash,
           {"command": "cd /work/tinyq && cat >> tests/test_retry.py <<'EOF'\n\n\ndef test_backoff_is_a_deprecated_alias():\n    import tinyq.retry\n\n    with pytest.warns(DeprecationWarning, match=\"RetryPolicy\"):\n        alias = tinyq.retry.Backoff\n    assert alias is RetryPolicy\nEOF\npython -m pytest -v -W error::DeprecationWarning"},
           bash_result(0, pytest_verbose(2)))
    s.call(None, bash, {"command": "cd /work/tinyq && git diff tinyq/worker.py tinyq/__init__.py"},
           bash_result(0, "\n".join(
               diff("tinyq/__init__.py", [("@@ -6,7 +6,15 @@", [
                   " from tinyq.config import WorkerConfig",
                   " from tinyq.queue import Queue",
                   "-from tinyq.retry import Backoff, RetryExhausted",
                   "+from tinyq.retry import RetryExhausted, RetryPolicy",
                   "+",
                   "+",
                   "+def __getattr__(name: str):",
                   "+    if name == \"Backoff\":",
                   "+        from tinyq import retry",
                   "+",
                   "+        return retry.Backoff  # warns",
                   "+    raise AttributeError(f\"module {__name__!r} has no attribute {name!r}\")"]),
                   ("@@ -18,7 +26,7 @@ __all__ = [", [
                   "     \"Queue\",",
                   "     \"WorkerConfig\",",
                   "-    \"Backoff\",",
                   "+    \"RetryPolicy\",",
                   "     \"RetryExhausted\",",
                   " ]"])])
               + diff("tinyq/worker.py", [("@@ -12,7 +12,7 @@", [
                   " from tinyq import metrics",
                   " from tinyq.broker import Broker, Job",
                   " from tinyq.config import WorkerConfig",
                   "-from tinyq.retry import Backoff, RetryExhausted, classify, reason",
                   "+from tinyq.retry import RetryExhausted, RetryPolicy, classify, reason"]),
                   ("@@ -32,7 +32,7 @@ class Worker:", [
                   "         self.config = config",
                   "         self.broker = broker",
                   "         self.handlers = dict(handlers)",
                   "-        self.policy = Backoff.from_config(config)",
                   "+        self.policy = RetryPolicy.from_config(config)",
                   "         self._pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix=\"tinyq\")"])]))))
    s.say(
        "Renamed `Backoff` to `RetryPolicy` in tinyq/retry.py, worker.py, queue.py, __init__.py and the tests. "
        "`tinyq.retry.Backoff` and `tinyq.Backoff` still work through a module `__getattr__` that raises a "
        "DeprecationWarning (\"use RetryPolicy\"); a new test checks it. The suite passes with "
        "`-W error::DeprecationWarning`, so nothing inside tinyq still uses the old name. README, docs/retries.md "
        "and CHANGELOG.md still say `Backoff`."
    )

    # Ask 4: the docs.
    s.user(
        "Good. Please update the docs for both changes: README (the config table and the retries section), "
        "docs/retries.md, and a CHANGELOG entry under Unreleased. Mention the deprecation."
    )
    s.call(None, "read_file", {"path": "README.md"}, numbered(readme_md()))
    s.call("I'll regenerate the README's configuration table and retries section from the new names.", "write_file",
           {"path": "README.md", "content": readme_md(cls="RetryPolicy", jitter=True)},
           f"Wrote {len(readme_md(cls='RetryPolicy', jitter=True).encode())} bytes to README.md.")
    s.call(None, bash, {"command": "cd /work/tinyq && sed -n 1,40p docs/retries.md"},
           bash_result(0, "\n".join([
               "# Retries", "", "`Backoff` decides when a failed job runs again.", "",
               "## The delay", "", "Attempt *n* (counted from 1) waits", "", "    base_delay * factor ** (n - 1)", "",
               "seconds, capped at `max_delay`. With the defaults (1 s, x2, 300 s) the waits are", "1, 2, 4, 8 s for the",
               "five attempts of a job.", "", "## Per-job policies", "", "A producer can override the worker's policy for one job:", "",
               "```python", "queue.enqueue(\"resize_avatar\", tenant_id=\"t\", item_id=\"42\",", "",
               "    retry=", "    Backoff(base_delay=0.5, factor=3, max_delay=60)", ")", "```", "",
               "## Which errors are retried", "", "See the table in the README; unknown errors are retried.",
           ])))
    s.call(None, bash,
           {"command": "cd /work/tinyq && sed -i 's/`Backoff` decides/`RetryPolicy` decides/; s/    Backoff(base_delay/    RetryPolicy(base_delay/' docs/retries.md && cat >> docs/retries.md <<'EOF'\n\n## Jitter\n\nWith `retry_jitter = j` (0 to 1) each delay `d` becomes a random value in\n`[d - j*d, d]`. Jobs that failed together (a broker restart) then spread their\nretries instead of arriving at once. The cap still holds.\n\n`Backoff` is a deprecated alias of `RetryPolicy` and will be removed in 0.9.\nEOF\ngrep -n \"Backoff\\|RetryPolicy\\|jitter\" docs/retries.md"},
           bash_result(0, "3:`RetryPolicy` decides when a failed job runs again.\n27:    RetryPolicy(base_delay=0.5, factor=3, max_delay=60)\n34:## Jitter\n36:With `retry_jitter = j` (0 to 1) each delay `d` becomes a random value in\n41:`Backoff` is a deprecated alias of `RetryPolicy` and will be removed in 0.9."))
    s.call(None, "str_replace",
           {"path": "CHANGELOG.md",
            "old": "## Unreleased\n",
            "new": "## Unreleased\n\n### Fixed\n\n- `Backoff.delay()` now caps every delay at `max_delay`; before, only the first one was capped.\n\n### Added\n\n- `retry_jitter` setting (`TINYQ_RETRY_JITTER`) and `RetryPolicy(jitter=...)`: spread retries of jobs that failed together.\n\n### Changed\n\n- `Backoff` is renamed `RetryPolicy`. `Backoff` still works but raises a DeprecationWarning; it will be removed in 0.9.\n"},
           "Replaced 1 occurrence in CHANGELOG.md (line 3).")
    s.call("Final check: tests, and no stale name outside the alias and the changelog.", bash,
           {"command": "cd /work/tinyq && python -m pytest -q && grep -rn \"Backoff\" --include=*.py --include=*.md . | grep -v CHANGELOG"},
           bash_result(0, pytest_run(2, "3.95s") + "\ntinyq/retry.py:133:    if name == \"Backoff\":\ntinyq/retry.py:136:        warnings.warn(\"tinyq.retry.Backoff is deprecated; use RetryPolicy\", DeprecationWarning, stacklevel=2)\ntinyq/__init__.py:13:    if name == \"Backoff\":\ntinyq/__init__.py:16:        return retry.Backoff  # warns\ntests/test_retry.py:198:def test_backoff_is_a_deprecated_alias():\ntests/test_retry.py:202:        alias = tinyq.retry.Backoff\ndocs/retries.md:41:`Backoff` is a deprecated alias of `RetryPolicy` and will be removed in 0.9."))
    s.say(
        "Docs updated: README.md (the configuration table has `retry_jitter` / `TINYQ_RETRY_JITTER`; the retries "
        "section uses `RetryPolicy` and explains jitter), docs/retries.md (new name, a Jitter section, the "
        "deprecation note), and CHANGELOG.md under Unreleased (Fixed: the cap; Added: jitter; Changed: the rename "
        "and the deprecated alias, removed in 0.9). The remaining `Backoff` mentions are the alias itself, its "
        f"test and the deprecation notes. All {test_count(2)} tests pass."
    )
    return s.messages


def render():
    """The file's exact text."""
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"
