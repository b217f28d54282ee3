//! The engine's view of one request, per API: the client's history read
//! in the chat view, the one session step ([`step`]), and the managed
//! request written back in the client's format.
//!
//! Chat completions hand their messages to the step as they are and send
//! its rendered messages. Anthropic Messages and Responses read the
//! request in their own format ([`FrontRequest::parse_parts`], the
//! library's lossless model and bridge, reusing the session's
//! [`FrontCache`] so only messages new since the last call are parsed and
//! bridged) and rebuild the managed request in it (every message the
//! engine did not change as the client's own bytes).

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};

use context_engine::front::{self as lib, FrontCache, FrontKind, FrontRequest};
use serde_json::value::RawValue;

use crate::body::ChatBody;
use crate::session::requests::Wire;
use crate::session::step::{self, Keep, Request};
use crate::session::{Managed, Plan, SessionContext, SessionError, SessionKey};

/// The managed request of one call.
pub(crate) struct View {
    /// The session step's plan.
    pub plan: Plan,
    /// The fields written over the client's body (`None`: chat's
    /// `messages`, taken from the plan once it is accounted).
    fields: Option<Vec<(&'static str, String)>>,
    /// Whether a compaction's summary got a cache breakpoint (Anthropic).
    pub marked_prefix: bool,
}

impl View {
    /// The fields to write over the client's body.
    pub fn into_fields(self) -> Vec<(&'static str, String)> {
        match self.fields {
            Some(fields) => fields,
            None => vec![("messages", self.plan.messages_json)],
        }
    }
}

/// Why a request goes unmanaged: the session step failed, or the request
/// cannot be read or rebuilt in its format.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ViewError {
    /// The session step failed.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The request is not one of its format.
    #[error("unreadable {kind} request: {error}")]
    Unreadable {
        /// The format.
        kind: FrontKind,
        /// What is wrong with it.
        error: context_engine::anthropic::FormatError,
    },
    /// The managed request, rebuilt in the client's format, would break
    /// one of the format's rules.
    #[error("the managed {kind} request would break a rule: {violation}")]
    Rule {
        /// The format.
        kind: FrontKind,
        /// The rule broken.
        violation: context_engine::validate::Violation,
    },
}

/// The session a step runs on and where it is kept.
pub(crate) type Target<'a> = (&'a Arc<SessionContext>, &'a SessionKey, Keep<'a>);

/// The managed request for `split` (a request of `api`), from the session
/// in `slot` (built on first use).
pub(crate) fn prepare(
    api: Wire,
    slot: &mut Option<Managed>,
    cache: &Mutex<FrontCache>,
    (ctx, key, keep): Target<'_>,
    split: &ChatBody<'_>,
) -> Result<View, ViewError> {
    let model = split.model();
    let model = model.as_deref();
    let kind = match api {
        Wire::Chat => {
            let plan = step::step(
                slot,
                ctx,
                key,
                keep,
                Request {
                    raw: split.messages(),
                    model,
                    keep_request: false,
                },
            )?;
            return Ok(View {
                plan,
                fields: None,
                marked_prefix: false,
            });
        }
        Wire::Front(kind) => kind,
    };
    let fields = split.fields();
    let items = lib::split_items(kind, &fields);
    let mut kept = std::mem::take(&mut *cache.lock().unwrap_or_else(PoisonError::into_inner));
    let mut front = FrontRequest::parse_parts(kind, &fields, items.as_deref(), &mut kept)
        .map_err(|error| ViewError::Unreadable { kind, error })?;
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let refs: Vec<&RawValue> = front.chat_json().iter().map(AsRef::as_ref).collect();
        let plan = step::step(
            slot,
            ctx,
            key,
            keep,
            Request {
                raw: &refs,
                model,
                keep_request: true,
            },
        )?;
        drop(refs);
        // Only Anthropic's cache needs to know where to mark.
        let stable = match (kind, slot.as_ref()) {
            (FrontKind::Anthropic, Some(m)) => m.stable_prefix(&plan.request),
            _ => plan.request.len(),
        };
        let rebuilt = front
            .rebuild_with(&plan.request, items.as_deref(), stable)
            .map_err(|violation| ViewError::Rule { kind, violation })?;
        Ok(View {
            plan,
            fields: Some(rebuilt.fields),
            marked_prefix: rebuilt.marked_prefix,
        })
    }));
    match result {
        Ok(outcome) => {
            kept.keep(front);
            *cache.lock().unwrap_or_else(PoisonError::into_inner) = kept;
            outcome
        }
        Err(_) => {
            *slot = None;
            Err(SessionError::Panicked.into())
        }
    }
}
