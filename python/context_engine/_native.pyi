"""Type stubs of the extension ``context_engine._native`` (the Rust library).

Messages are plain OpenAI chat-completions dicts. Every function takes a
``list`` (or ``tuple``) of them and returns new dicts with the same keys in
the same order, unknown keys included. Bad input raises ``ValueError``
naming the message index and field (``message 3, field `tool_calls[0].id`:
expected a string, found a number``).
"""

from os import PathLike
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

Message = Dict[str, Any]
Messages = Union[List[Message], Tuple[Message, ...]]
Report = Dict[str, Any]

__version__: str

class ContextEngineError(Exception):
    """Base class of every error the engine reports; the message is the one
    the ``ctx`` CLI prints."""

class ValidationError(ContextEngineError):
    """A transcript breaks a provider rule (``ensure_valid``), or an engine
    produced one that would (``Compressor.compress``)."""

class ConfigError(ContextEngineError):
    """The configuration (``config.yaml``, ``CTX_…`` variables, ``settings``)
    cannot be used: names the key and where it came from."""

class Compressor:
    """The context engine the configuration names (``context.engine``: the
    built-in ``compressor`` by default, or a plugin), built as ``ctx`` and
    ``ctx serve`` build it, with every hook of the pluggable context-engine
    interface.

    Threshold compaction keeps the head and a token-budgeted tail verbatim
    and replaces the middle with one structured summary (offline extractive
    summarizer, or an OpenAI-compatible endpoint from the configuration);
    ``select_context`` digests old bulky tool results per request;
    ``prune_tool_results_only`` trims stale tool output; the
    ``context_recall`` tool gives digested output back.

    Thread-safe: one engine may be shared by threads (calls are serialized),
    and the interpreter is released while the engine works.
    """

    def __init__(
        self,
        context_length: Optional[int] = None,
        *,
        model: Optional[str] = None,
        encoding: str = "o200k_base",
        config: Optional[Union[str, PathLike[str]]] = None,
        settings: Optional[Dict[str, Any]] = None,
        use_config: bool = True,
        profile: str = "openai",
    ) -> None:
        """Builds the engine from the configuration layers, as ``ctx`` does.

        Args:
            context_length: the model's window in tokens (default:
                ``context.context_length`` of the configuration, else
                128000, as ``ctx``).
            model: the agent's model; picks the tokenizer (and a safety
                factor for unknown models).
            encoding: ``o200k_base`` or ``cl100k_base`` when no model is given.
            config: a ``config.yaml`` to read.
            settings: configuration keys over the file, as nested dicts
                (``{"context": {"threshold_percent": 0.6}}``).
            use_config: when no ``config`` is given, look for one (``$CTX_CONFIG``,
                ``./config.yaml``, the user's config folder) and read
                ``CTX_…`` variables; ``False`` uses defaults plus ``settings``.
            profile: provider rules the output must keep: ``openai`` or ``strict``.

        Raises:
            ConfigError: the configuration cannot be used.
            ValueError: an unknown encoding or profile.
        """
    def __deepcopy__(self, memo: Any) -> "Compressor":
        """A fresh engine with the same configuration and token state."""
    def __copy__(self) -> "Compressor": ...

    # -- identity and state --------------------------------------------------
    @property
    def name(self) -> str:
        """The engine's name: ``"compressor"``, or the plugin's."""
    @property
    def summarizer(self) -> str:
        """The primary summarizer's name (``extractive`` or ``openai``;
        ``plugin:NAME`` when a plugin engine writes its own summaries)."""
    @property
    def config_warnings(self) -> List[str]:
        """Warnings of the configuration (unknown keys), as ``ctx`` prints them."""
    @property
    def config_file(self) -> Optional[Path]:
        """The ``config.yaml`` that was read, if any."""
    last_prompt_tokens: int
    """Prompt tokens of the last call; ``-1`` while awaiting real usage after
    a compaction (setting ``-1`` enters that state)."""
    last_completion_tokens: int
    last_total_tokens: int
    threshold_tokens: int
    """Prompt size at which compaction fires."""
    compression_count: int
    threshold_percent: float
    protect_first_n: int
    protect_last_n: int
    emit_automatic_compaction_status: bool
    @property
    def context_length(self) -> int:
        """The model's window (0 = unknown); change it with ``update_model``."""
    @property
    def awaiting_real_usage(self) -> bool:
        """A compaction ran and no real usage has been reported since."""
    @property
    def last_report(self) -> Optional[Report]:
        """What the last ``compress`` did: ``outcome`` (``compacted``,
        ``fallback``, ``aborted``, ``nothing_to_compress``, ``blocked``,
        ``invalid_output``), messages and tokens before/after, head, tail,
        summarizer, reason, ... ; ``None`` before the first call."""

    # -- core hooks ----------------------------------------------------------------
    def update_from_response(self, usage: Dict[str, Any]) -> None:
        """Records a provider's ``usage`` (OpenAI, Responses, Anthropic or
        DeepSeek dialect). Raises ``ValueError`` when it has no prompt count."""
    def should_compress(self, prompt_tokens: Optional[int] = None) -> bool:
        """Whether compaction should fire for ``prompt_tokens`` (default: the
        last real count)."""
    def should_compress_info(
        self, prompt_tokens: Optional[int] = None
    ) -> Tuple[bool, Optional[str]]:
        """``(should_compress, reason)``: the reason compaction is held back
        (cooldown, ineffective compactions), for the user."""
    def compress(
        self,
        messages: Messages,
        current_tokens: Optional[int] = None,
        focus_topic: Optional[str] = None,
        force: bool = False,
        memory_context: str = "",
    ) -> List[Message]:
        """The compacted transcript: head, summary, tail; never adds a
        provider-rule violation. The input is not modified.

        Raises:
            ContextEngineError: nothing to compress, blocked (cooldown or
                anti-thrash, unless ``force``), or the summarizer failed in a
                way that must not be papered over (``last_report`` says which).
            ValidationError: the result would have broken a provider rule.
            ValueError: malformed messages.
        """

    # -- optional hooks -----------------------------------------------------------------
    def prune_tool_results_only(
        self, messages: Messages, current_tokens: Optional[int] = None
    ) -> Tuple[List[Message], int]:
        """Stale and duplicate tool output replaced by markers, without an LLM
        call; ``(messages, n_pruned)``. Off until
        ``context.prune.proactive_prune_tokens`` is set; returns the same list
        object when nothing was pruned."""
    def select_context(
        self,
        request_messages: Messages,
        *,
        conversation_messages: Optional[Messages] = None,
        incoming_message: Optional[Message] = None,
        budget_tokens: int = 0,
    ) -> Optional[List[Message]]:
        """The request view for this call (old bulky tool results digested to
        one line with a recall handle), or ``None`` to send it unchanged."""
    def on_turn_complete(
        self, messages: Messages, usage: Optional[Dict[str, Any]] = None, **kwargs: Any
    ) -> None:
        """Observes a finished turn (``turn_id``, ``task_id``,
        ``api_call_count``, ``interrupted``, ``failed``, ``turn_exit_reason``)."""
    def should_compress_preflight(self, messages: Messages) -> bool:
        """Cheap check before the API call, from an exact count of ``messages``."""
    def should_defer_preflight_to_real_usage(self, rough_tokens: int) -> bool:
        """Whether preflight should trust the last real usage over an estimate."""
    def get_automatic_compaction_status_message(
        self, *, phase: str, default_message: str, **context: Any
    ) -> Optional[str]:
        """The status line for an automatic compaction (``phase``:
        ``preflight`` or ``compress``), or ``None`` to stay silent."""
    def has_content_to_compress(self, messages: Messages) -> bool:
        """False when everything is protected (a manual compaction would do nothing)."""
    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        """A session begins (``hermes_home`` / ``home_dir``, ``platform``, ``model``)."""
    def on_session_end(self, session_id: str, messages: Messages) -> None:
        """A real session boundary."""
    def on_session_reset(self) -> None:
        """``/new`` or ``/reset``: counters, cooldowns and token tracking start over."""
    def get_tool_schemas(self) -> List[Dict[str, Any]]:
        """The engine's tools (``context_recall``), in OpenAI tool form."""
    def handle_tool_call(self, name: str, args: Dict[str, Any], **kwargs: Any) -> str:
        """Runs one of the engine's tools (pass ``messages=`` the live
        conversation); returns the tool result as a JSON string."""
    def get_status(self) -> Report:
        """``last_prompt_tokens``, ``threshold_tokens``, ``context_length``,
        ``usage_percent``, ``compression_count``, ``awaiting_real_usage`` and
        the engine's own fields (summarizer, cooldown, streaks)."""
    def update_model(
        self,
        model: str,
        context_length: int,
        base_url: str = "",
        api_key: str = "",
        provider: str = "",
        api_mode: str = "",
    ) -> None:
        """Model switch: adopt the window and recompute the threshold
        (per-model overrides from ``context.model_thresholds``)."""

    # -- extras -------------------------------------------------------------------
    def count_tokens(self, messages: Messages) -> int:
        """Tokens of ``messages`` by this engine's counter."""

def count_tokens(
    value: Union[str, Messages], *, encoding: str = "o200k_base", model: Optional[str] = None
) -> int:
    """Exact tokens of a text, or of a message list as a provider bills it
    (per-message overhead, tool calls, image parts)."""

def validate(messages: Messages, *, profile: str = "openai") -> List[Dict[str, Any]]:
    """Every provider-rule violation, ``[{"index", "rule", "detail"}]``
    (``profile``: ``openai`` or ``strict``)."""

def ensure_valid(messages: Messages, *, profile: str = "openai") -> None:
    """Raises ``ValidationError`` listing every violation, as ``ctx validate``."""

def digest(
    messages: Messages,
    *,
    keep_batches: Optional[int] = None,
    min_bytes: Optional[int] = None,
    config: Optional[Union[str, PathLike[str]]] = None,
    settings: Optional[Dict[str, Any]] = None,
    use_config: bool = True,
) -> List[Message]:
    """The request view: tool results older than the newest ``keep_batches``
    batches and at least ``min_bytes`` long replaced by one line with a
    recall handle. The options come from the configuration as for ``ctx
    digest`` (``context.digest``, ``context.text_actions``; ``config``,
    ``settings`` and ``use_config`` as for ``Compressor``); the arguments
    win (defaults 1 and 4096)."""

def digest_with_report(
    messages: Messages,
    *,
    keep_batches: Optional[int] = None,
    min_bytes: Optional[int] = None,
    config: Optional[Union[str, PathLike[str]]] = None,
    settings: Optional[Dict[str, Any]] = None,
    use_config: bool = True,
) -> Tuple[List[Message], Report]:
    """``digest`` and its report (``results_digested``, ``bytes_before``, ...)."""

def redact(
    text: str,
    *,
    patterns: Optional[Sequence[str]] = None,
    url_credentials: bool = True,
    config: Optional[Union[str, PathLike[str]]] = None,
    settings: Optional[Dict[str, Any]] = None,
    use_config: bool = True,
) -> str:
    """``text`` with secrets masked: the built-in rules, the configuration's
    ``security.redact_patterns`` and the regexes in ``patterns`` (as ``ctx
    redact``). Raises ``ConfigError`` for an invalid pattern."""

def load_transcript(path: Union[str, PathLike[str]]) -> List[Message]:
    """The messages of a transcript file (JSON array, ``{"messages": …}``,
    SWE-agent ``{"history": …}`` or JSON Lines). ``OSError`` when it cannot
    be read, ``ValueError`` naming line and column when it is malformed."""

def replay(
    session: Union[str, PathLike[str], Messages],
    *,
    context_length: Optional[int] = None,
    model: Optional[str] = None,
    config: Optional[Union[str, PathLike[str]]] = None,
    settings: Optional[Dict[str, Any]] = None,
    use_config: bool = True,
    profile: str = "openai",
    store: Optional[Union[str, PathLike[str]]] = None,
    session_id: Optional[str] = None,
    archive: bool = True,
    baseline: bool = True,
) -> Report:
    """Replays a recorded session (messages or a file) through the engine
    of the configuration, call by call, as an agent would have run it;
    returns exactly the report ``ctx replay --json`` prints for the same
    arguments (totals, costs of the three policies, compactions, retention,
    calls; ``file`` first when ``session`` is a path).

    ``context_length`` defaults as in ``ctx`` (``context.context_length``,
    else 128000); prices come from ``pricing.*`` (``settings``). The replay
    archives into ``store`` (a SQLite file, as ``ctx replay --store``; in
    memory by default; ``archive=False`` as ``--no-store``) under
    ``session_id`` (default: the file's name); ``baseline=False`` skips the
    every-call-digest run (``--no-baseline``)."""

def run_cli(argv: List[str]) -> int:
    """Runs the ``ctx`` command line with ``argv`` (the program name first)
    in this process and returns its exit status (0 success, 1 checked and
    found wanting, 2 error, 141 stdout closed). The ``ctx`` console script
    (``context_engine._cli``) calls it with ``sys.argv``."""
