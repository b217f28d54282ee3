//! One session step, whatever keeps the session: the client's full history
//! in, the managed request out.
//!
//! Every managed API (chat completions, Anthropic Messages, Responses)
//! comes here with the history in the chat view and the model the request
//! names. Where the session lives is a strategy, not a second driver:
//! [`Keep::Memory`] builds the session on first use in this process;
//! [`Keep::Store`] brings the cached copy up to date from the store, runs
//! the same step and commits it ([`persist::prepare_stored`]). Either way
//! the step itself is [`Managed::prepare`] under the window of the model
//! the request names ([`Managed::use_model`]).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use serde_json::value::RawValue;

use super::persist::{self, SharedStore};
use super::{Managed, Plan, SessionContext, SessionError, SessionKey};

/// Where the session is kept.
#[derive(Clone, Copy, Debug)]
pub enum Keep<'a> {
    /// In this process only.
    Memory,
    /// In a session store (SQLite, Postgres), cached here.
    Store(&'a SharedStore),
}

impl<'a> Keep<'a> {
    /// The strategy for an optional store.
    pub fn of(store: Option<&'a SharedStore>) -> Keep<'a> {
        store.map_or(Keep::Memory, Keep::Store)
    }

    /// Whether a step may block on I/O (the store).
    pub fn blocks(&self) -> bool {
        matches!(self, Keep::Store(_))
    }
}

/// What a request hands the session.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The client's full history, each message as the client wrote it
    /// (the chat view of the request).
    pub raw: &'a [&'a RawValue],
    /// The model the request names: its window, when
    /// `context.model_windows` has one, is the one managed against.
    pub model: Option<&'a str>,
    /// Whether the caller needs [`Plan::request`] (a front that rebuilds
    /// the request in its own format); chat completions send
    /// [`Plan::messages_json`] only.
    pub keep_request: bool,
}

/// Runs the step for `key` on `slot` (built on first use); a panic in the
/// engine resets the session and fails open like an error. On `Err` the
/// request goes upstream unmanaged; the reason says why.
pub fn step(
    slot: &mut Option<Managed>,
    ctx: &Arc<SessionContext>,
    key: &SessionKey,
    keep: Keep<'_>,
    request: Request<'_>,
) -> Result<Plan, SessionError> {
    let run = |m: &mut Managed| {
        m.use_model(request.model.map(str::to_owned));
        m.prepare_as(request.raw, request.keep_request)
    };
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| match keep {
        Keep::Store(store) => persist::prepare_stored(slot, ctx, key, store, run),
        Keep::Memory => {
            if slot.is_none() {
                *slot = Some(Managed::new(Arc::clone(ctx), &key.id)?);
            }
            match slot.as_mut() {
                Some(m) => run(m),
                None => Err(SessionError::NoSession),
            }
        }
    }));
    result.unwrap_or_else(|_| {
        *slot = None;
        Err(SessionError::Panicked)
    })
}
