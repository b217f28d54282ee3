"""context-engine: keep an LLM agent's context window valid and small.

The Rust library in process, over plain OpenAI-format message dicts (keys,
their order and unknown fields survive a round trip):

- :class:`Compressor`, the built-in engine, with every hook of the
  pluggable context-engine interface (``update_from_response``,
  ``should_compress``, ``compress``, ``select_context``, ...);
- :func:`count_tokens` (exact ``o200k_base`` / ``cl100k_base``),
  :func:`validate` / :func:`ensure_valid` (provider rules),
  :func:`digest` (request view), :func:`redact` (secrets),
  :func:`load_transcript` and :func:`replay` (the ``ctx replay`` report).

Errors: bad input is a ``ValueError`` naming the message index and field;
engine errors are :class:`ContextEngineError` and its subclasses
:class:`ValidationError` and :class:`ConfigError`, with the message the
``ctx`` CLI prints. The interpreter is released during engine work.

Hermes Agent users: ``python -m context_engine.hermes install``.
"""

from ._native import (
    Compressor,
    ConfigError,
    ContextEngineError,
    ValidationError,
    __version__,
    count_tokens,
    digest,
    digest_with_report,
    ensure_valid,
    load_transcript,
    redact,
    replay,
    validate,
)

__all__ = [
    "Compressor",
    "ConfigError",
    "ContextEngineError",
    "ValidationError",
    "__version__",
    "count_tokens",
    "digest",
    "digest_with_report",
    "ensure_valid",
    "load_transcript",
    "redact",
    "replay",
    "validate",
]
