"""context-engine inside Hermes Agent: the context engine ``ctx``.

:class:`CtxEngine` subclasses Hermes's ABC ``agent.context_engine.ContextEngine``
and delegates every hook to the Rust engine (:class:`context_engine.Compressor`).
Hermes is imported only here, and only when this module is used.

Install it into Hermes::

    python -m context_engine.hermes install      # writes $HERMES_HOME/plugins/ctx/

then add to Hermes's ``config.yaml``::

    plugins:
      enabled: [ctx]
    context:
      engine: ctx

Settings come from Hermes's own config section for the plugin,
``plugins.entries.ctx`` (keys as in context-engine's ``config.yaml``:
``context``, ``summarizer``, ``security``; plus ``config_file``, a path to a
context-engine ``config.yaml``), layered over context-engine's
``config.yaml`` (``$CTX_CONFIG``, else ``$XDG_CONFIG_HOME/context-engine/config.yaml``)
and its ``CTX_…`` variables.

What Hermes expects, read from its code (0.19.0): it deep-copies the
registered engine per agent; it writes ``last_prompt_tokens`` (``-1`` after a
compaction), ``last_completion_tokens``, ``awaiting_real_usage_after_compression``,
``last_compression_rough_tokens`` and, when its summary model is smaller,
``threshold_tokens`` / ``threshold_percent`` directly; it calls
``update_from_response({})`` when a response had no usage; it reads
``_last_compress_aborted`` / ``_last_summary_error`` /
``_last_compression_made_progress`` / ``_last_summary_fallback_used`` after
``compress``; it never passes the system message to ``compress``; and it
rejects windows below 64,000 tokens. The hooks newer Hermes versions call
(``select_context``, ``on_turn_complete``) are implemented too; 0.19.0 simply
never calls them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CtxEngine", "ENGINE_NAME", "register", "hermes_settings"]

#: The engine's name in Hermes (``context.engine: ctx``) and the plugin's.
ENGINE_NAME = "ctx"


def register(ctx: Any) -> None:
    """The plugin's ``register(ctx)``: registers a :class:`CtxEngine` built
    from Hermes's settings for it."""
    from .adapter import register as _register

    _register(ctx)


def __getattr__(name: str) -> Any:
    # Hermes is imported on first use of the adapter, so that
    # ``python -m context_engine.hermes install`` works without it.
    if name in ("CtxEngine", "hermes_settings"):
        from . import adapter

        return getattr(adapter, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
