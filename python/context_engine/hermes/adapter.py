"""The Hermes adapter: :class:`CtxEngine` (imports Hermes; see the package docs)."""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from agent.context_engine import ContextEngine  # Hermes: imported only here

from .. import _native
from .._native import ContextEngineError
from . import ENGINE_NAME

__all__ = ["CtxEngine", "ENGINE_NAME", "register", "hermes_settings"]


#: Keys of ``plugins.entries.ctx`` that are Hermes's or the adapter's, not
#: context-engine configuration.
_ADAPTER_KEYS = {"config_file", "enabled", "allow_tool_override"}

logger = logging.getLogger("context_engine.hermes")


def hermes_settings() -> Dict[str, Any]:
    """Hermes's config section for the engine (``plugins.entries.ctx``), or
    ``{}`` when Hermes has none (or its config cannot be read)."""
    try:
        from hermes_cli.config import load_config

        cfg = load_config() or {}
    except Exception as exc:  # Hermes's config problems are Hermes's to report
        logger.debug("cannot read Hermes's config: %s", exc)
        return {}
    plugins = cfg.get("plugins") if isinstance(cfg, dict) else None
    entries = plugins.get("entries") if isinstance(plugins, dict) else None
    section = entries.get(ENGINE_NAME) if isinstance(entries, dict) else None
    return dict(section) if isinstance(section, dict) else {}


def _our_config_file(explicit: Optional[str]) -> Optional[Path]:
    """context-engine's ``config.yaml``: the section's ``config_file``, else
    ``$CTX_CONFIG``, else the user's config folder. The working directory is
    not searched: Hermes runs in the user's projects, where a ``config.yaml``
    is usually someone else's."""
    if explicit:
        return Path(os.path.expanduser(str(explicit)))
    env = os.environ.get("CTX_CONFIG")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(
        os.path.expanduser("~"), ".config"
    )
    candidate = Path(base) / "context-engine" / "config.yaml"
    return candidate if candidate.is_file() else None


def _state(name: str, cast: Callable[[Any], Any], doc: str = "") -> Any:
    """A property reading and writing the Rust engine's attribute `name`."""
    return property(
        lambda self: getattr(self._engine, name),
        lambda self, value: setattr(self._engine, name, cast(value)),
        doc=doc or f"The Rust engine's `{name}`.",
    )


class CtxEngine(ContextEngine):
    """Hermes context engine backed by context-engine's Rust compressor.

    Token state lives in the Rust engine; the attributes Hermes reads and
    writes directly are properties over it.
    """

    def __init__(
        self,
        settings: Optional[Dict[str, Any]] = None,
        *,
        context_length: Optional[int] = None,
        model: Optional[str] = None,
    ) -> None:
        section = dict(hermes_settings() if settings is None else settings)
        config_file = _our_config_file(section.get("config_file"))
        ours = {k: v for k, v in section.items() if k not in _ADAPTER_KEYS}
        self._engine = _native.Compressor(
            context_length,
            model=model,
            config=str(config_file) if config_file else None,
            settings=ours or None,
            use_config=config_file is not None,
        )
        for warning in self._engine.config_warnings:
            logger.warning("context-engine config: %s", warning)
        self._model = model or ""
        # Read by Hermes after compress() (getattr with defaults).
        self._last_compression_made_progress = False
        self._last_summary_fallback_used = False
        self._last_compress_aborted = False
        self._last_summary_error: Optional[str] = None
        #: Hermes's own rough estimate after its last compaction (diagnostics).
        self.last_compression_rough_tokens = 0
        #: Calls of each hook, for status and tests.
        self.compress_calls = 0

    # -- identity -------------------------------------------------------------

    @property
    def name(self) -> str:
        return ENGINE_NAME

    @property
    def engine(self) -> "_native.Compressor":
        """The Rust engine behind this adapter."""
        return self._engine

    # -- token state Hermes reads and writes directly --------------------------

    # Plain delegations (what Hermes writes, the Rust engine keeps).
    last_prompt_tokens = _state(
        "last_prompt_tokens", int, "Prompt tokens of the last call; -1 while awaiting real usage."
    )
    last_completion_tokens = _state("last_completion_tokens", int)
    last_total_tokens = _state("last_total_tokens", int)
    threshold_tokens = _state("threshold_tokens", int, "Prompt size at which compaction fires.")
    compression_count = _state("compression_count", int)
    threshold_percent = _state("threshold_percent", float)
    protect_first_n = _state("protect_first_n", int)
    protect_last_n = _state("protect_last_n", int)
    emit_automatic_compaction_status = _state("emit_automatic_compaction_status", bool)

    @property
    def last_real_prompt_tokens(self) -> int:
        """The last prompt count (0 while awaiting real usage); Hermes logs it."""
        return max(self._engine.last_prompt_tokens, 0)

    @property
    def context_length(self) -> int:  # type: ignore[override]
        return self._engine.context_length

    @context_length.setter
    def context_length(self, value: int) -> None:
        # A probed window: recompute the threshold as a model switch does.
        self._engine.update_model(self._model, int(value))

    @property
    def awaiting_real_usage_after_compression(self) -> bool:
        return self._engine.awaiting_real_usage

    @awaiting_real_usage_after_compression.setter
    def awaiting_real_usage_after_compression(self, value: bool) -> None:
        if value and not self._engine.awaiting_real_usage:
            self._engine.last_prompt_tokens = -1
        elif not value and self._engine.awaiting_real_usage:
            self._engine.last_prompt_tokens = 0

    # -- copies -------------------------------------------------------------------

    def __deepcopy__(self, memo: Dict[int, Any]) -> "CtxEngine":
        """Hermes copies the registered engine for each agent: a fresh Rust
        engine with the same configuration and token state."""
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            # The Rust engine's own __deepcopy__ rebuilds it.
            clone.__dict__[key] = copy.deepcopy(value, memo)
        return clone

    # -- core hooks ------------------------------------------------------------------

    def update_from_response(self, usage: Dict[str, Any]) -> None:
        if not usage or (
            usage.get("prompt_tokens") is None and usage.get("input_tokens") is None
        ):
            # A response without usage cannot tell whether the last
            # compaction worked; stop waiting for one (Hermes's contract).
            if self._engine.awaiting_real_usage:
                self._engine.last_prompt_tokens = 0
            return
        try:
            self._engine.update_from_response(usage)
        except ValueError as exc:
            logger.warning("ctx: ignoring unreadable usage %r: %s", usage, exc)

    def should_compress(self, prompt_tokens: Optional[int] = None) -> bool:
        return self._engine.should_compress(prompt_tokens)

    def should_compress_info(
        self, prompt_tokens: Optional[int] = None
    ) -> Tuple[bool, Optional[str]]:
        return self._engine.should_compress_info(prompt_tokens)

    def compress(
        self,
        messages: List[Dict[str, Any]],
        current_tokens: Optional[int] = None,
        focus_topic: Optional[str] = None,
        force: bool = False,
        memory_context: str = "",
    ) -> List[Dict[str, Any]]:
        """Compacts ``messages``; on any failure returns them unchanged (and
        says why through the attributes Hermes reads), never raises."""
        self.compress_calls += 1
        self._last_compression_made_progress = False
        self._last_summary_fallback_used = False
        self._last_compress_aborted = False
        self._last_summary_error = None
        try:
            out = self._engine.compress(
                messages,
                current_tokens=current_tokens,
                focus_topic=focus_topic,
                force=force,
                memory_context=memory_context or "",
            )
        except ValueError as exc:
            # Messages the engine cannot read: Hermes's bug or ours, loudly.
            logger.warning("ctx: cannot compact unreadable messages: %s", exc)
            return messages
        except ContextEngineError as exc:
            report = self._engine.last_report or {}
            if report.get("outcome") == "aborted":
                self._last_compress_aborted = True
                self._last_summary_error = str(exc)
            logger.info("ctx: compaction left the conversation unchanged: %s", exc)
            return messages
        report = self._engine.last_report or {}
        self._last_compression_made_progress = True
        self._last_summary_fallback_used = report.get("outcome") == "fallback"
        logger.info(
            "ctx: compacted %s -> %s messages, %s -> %s tokens (%s)",
            report.get("messages_before"),
            report.get("messages_after"),
            report.get("tokens_before"),
            report.get("tokens_after"),
            report.get("summarizer"),
        )
        return out

    # -- optional hooks ------------------------------------------------------------------

    def prune_tool_results_only(
        self, messages: List[Dict[str, Any]], current_tokens: Optional[int] = None
    ) -> Tuple[List[Dict[str, Any]], int]:
        try:
            return self._engine.prune_tool_results_only(messages, current_tokens)
        except (ContextEngineError, ValueError) as exc:
            logger.warning("ctx: prune skipped: %s", exc)
            return messages, 0

    def select_context(
        self,
        request_messages: List[Dict[str, Any]],
        *,
        conversation_messages: Optional[List[Dict[str, Any]]] = None,
        incoming_message: Optional[Dict[str, Any]] = None,
        budget_tokens: int = 0,
    ) -> Optional[List[Dict[str, Any]]]:
        try:
            return self._engine.select_context(
                request_messages,
                conversation_messages=conversation_messages,
                incoming_message=incoming_message,
                budget_tokens=budget_tokens or 0,
            )
        except (ContextEngineError, ValueError) as exc:
            logger.warning("ctx: request left unchanged: %s", exc)
            return None

    def on_turn_complete(
        self,
        messages: List[Dict[str, Any]],
        usage: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        try:
            self._engine.on_turn_complete(messages, usage or None, **kwargs)
        except (ContextEngineError, ValueError) as exc:
            logger.debug("ctx: on_turn_complete: %s", exc)

    def should_compress_preflight(self, messages: List[Dict[str, Any]]) -> bool:
        try:
            return self._engine.should_compress_preflight(messages)
        except (ContextEngineError, ValueError) as exc:
            logger.warning("ctx: preflight skipped: %s", exc)
            return False

    def should_defer_preflight_to_real_usage(self, rough_tokens: int) -> bool:
        return self._engine.should_defer_preflight_to_real_usage(int(rough_tokens or 0))

    def get_automatic_compaction_status_message(
        self, *, phase: str, default_message: str, **context: Any
    ) -> Optional[str]:
        try:
            return self._engine.get_automatic_compaction_status_message(
                phase=phase, default_message=default_message, **context
            )
        except ValueError:
            return default_message if self.emit_automatic_compaction_status else None

    def has_content_to_compress(self, messages: List[Dict[str, Any]]) -> bool:
        try:
            return self._engine.has_content_to_compress(messages)
        except (ContextEngineError, ValueError):
            return True

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        self._engine.on_session_start(session_id or "", **kwargs)

    def on_session_end(self, session_id: str, messages: List[Dict[str, Any]]) -> None:
        try:
            self._engine.on_session_end(session_id or "", messages or [])
        except (ContextEngineError, ValueError) as exc:
            logger.debug("ctx: on_session_end: %s", exc)

    def on_session_reset(self) -> None:
        self._engine.on_session_reset()

    def get_tool_schemas(self) -> List[Dict[str, Any]]:
        return self._engine.get_tool_schemas()

    def handle_tool_call(self, name: str, args: Dict[str, Any], **kwargs: Any) -> str:
        try:
            return self._engine.handle_tool_call(name, args, **kwargs)
        except (ContextEngineError, ValueError) as exc:
            import json

            return json.dumps({"error": f"{name}: {exc}"})

    def get_status(self) -> Dict[str, Any]:
        status = self._engine.get_status()
        status["engine"] = ENGINE_NAME
        return status

    def update_model(
        self,
        model: str,
        context_length: int,
        base_url: str = "",
        api_key: str = "",
        provider: str = "",
        api_mode: str = "",
    ) -> None:
        self._model = model or ""
        self._engine.update_model(
            model or "",
            int(context_length or 0),
            base_url=base_url or "",
            api_key=api_key or "",
            provider=provider or "",
            api_mode=api_mode or "",
        )


def register(ctx: Any) -> None:
    """The plugin's ``register(ctx)``: registers a :class:`CtxEngine` built
    from Hermes's settings for it."""
    ctx.register_context_engine(CtxEngine())
