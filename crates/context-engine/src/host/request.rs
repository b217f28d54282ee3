//! The request view: preflight, selection and fitting of the next model
//! call's request.

use crate::compressor::fit::{Fitted, Unfittable, fit, fit_noted, ledger_kept};
use crate::engine::{CompressRequest, SelectRequest, SummarySource};
use crate::message::Message;
use crate::store::Batch;
use crate::tokens::TokenCounter;
use crate::validate::validate;

use super::compact::held_back;
use super::update::swap_edits;
use super::{Applied, InPlace, MissedKind, Notice, Prepared, Session, Trigger, Update};

/// How a request's warning starts when the window could not hold the
/// summary's state record (what `ctx replay` reports per call).
pub const LEDGER_CUT: &str = "state record cut to fit the window";

impl Session {
    /// Leading messages of `request` (prepared by this session) the next
    /// request should carry as they are ([`ContextEngine::stable_prefix`](crate::engine::ContextEngine::stable_prefix)):
    /// where a host whose provider caches at breakpoints marks the cache.
    /// Asked only by such hosts, so other requests never pay for it.
    pub fn stable_prefix(&self, request: &[Message]) -> usize {
        self.engine.stable_prefix(request)
    }

    /// Preflight and context selection for the next model call on
    /// `history` (the persisted conversation, system prompt included).
    pub fn before_request(&mut self, history: &[Message]) -> Prepared {
        let mut update = Update::default();
        update.notices.append(&mut self.pending);
        // Preflight measures the request that would be sent, after
        // selection: a digest that keeps requests small also postpones
        // compaction, which keeps detail and the prompt cache longer.
        let (view, selected) = self.select(history, &mut update.notices);
        self.prepare_with(history, view, selected, update)
    }

    /// [`before_request`](Self::before_request) for a host that owns its
    /// history and sends it without a copy: when the engine's request view
    /// only replaces messages in place (a digest) and the step is a plain
    /// one (no compaction, nothing to fit to the window, a valid view), the
    /// replaced messages are swapped into `history`, which **is** the
    /// request until [`Applied::restore`] puts the originals back (do so
    /// before anything else reads the history). Otherwise `history` is
    /// left as it was and the result is exactly `before_request`'s. The
    /// decisions are the same either way.
    pub fn before_request_in_place(&mut self, history: &mut [Message]) -> InPlace {
        let mut update = Update::default();
        update.notices.append(&mut self.pending);
        let budget = self.engine.state().context_length;
        let edits = {
            let shared: &[Message] = history;
            let mut request = SelectRequest::new(shared, shared);
            if budget > 0 {
                request = request.with_budget_tokens(budget);
            }
            match self.engine.select_context_view(&request) {
                None => Ok(None),
                Some(view) => {
                    let in_place = view.len() == shared.len()
                        && view.iter().zip(shared).all(|(v, h)| match v {
                            std::borrow::Cow::Borrowed(b) => std::ptr::eq(*b, h),
                            std::borrow::Cow::Owned(_) => true,
                        });
                    if in_place {
                        Ok(Some(
                            view.into_iter()
                                .enumerate()
                                .filter_map(|(i, v)| match v {
                                    std::borrow::Cow::Owned(m) => Some((i, m)),
                                    std::borrow::Cow::Borrowed(_) => None,
                                })
                                .collect::<Vec<_>>(),
                        ))
                    } else {
                        Err(view
                            .into_iter()
                            .map(std::borrow::Cow::into_owned)
                            .collect::<Vec<_>>())
                    }
                }
            }
        };
        let (mut edits, selected) = match edits {
            Ok(Some(edits)) => (edits, true),
            Ok(None) => (Vec::new(), false),
            Err(view) => {
                let (view, selected) = self.checked(history, view, &mut update.notices);
                return InPlace::Prepared(self.prepare_with(history, view, selected, update));
            }
        };
        swap_edits(history, &mut edits);
        // From here `history` is the request view. A view with findings,
        // a compaction or a request over the window: the full way, on a
        // copy of the view, the history restored.
        let full_way = |this: &mut Session,
                        history: &mut [Message],
                        edits: &mut Vec<(usize, Message)>,
                        update: Update| {
            let view = selected.then(|| history.to_vec());
            swap_edits(history, edits);
            match view {
                Some(view) => {
                    let (view, selected) = this.checked(history, view, &mut Vec::new());
                    this.prepare_with(history, view, selected, update)
                }
                None => this.prepare_with(history, None, false, update),
            }
        };
        if selected && !validate(history, self.options.profile).is_empty() {
            let mut update = update;
            let view = history.to_vec();
            swap_edits(history, &mut edits);
            let (view, selected) = self.checked(history, view, &mut update.notices);
            return InPlace::Prepared(self.prepare_with(history, view, selected, update));
        }
        let window = self.engine.state().context_length;
        let mut measured = None;
        if !self.awaiting_usage {
            let rough = self.counter.count_messages(history) as u64;
            if self
                .engine
                .should_compress_preflight_counted(history, rough)
                || (window > 0 && rough > window)
            {
                return InPlace::Prepared(full_way(self, history, &mut edits, update));
            }
            measured = Some(rough);
            if !self.engine.should_defer_preflight_to_real_usage(rough) {
                let decision = self.engine.should_compress_info(Some(rough));
                if let Some(reason) = decision.block_reason {
                    held_back(&mut update, Trigger::Preflight, &reason);
                }
            }
        }
        let request_tokens =
            measured.unwrap_or_else(|| self.counter.count_messages(history) as u64);
        if window > 0 && request_tokens > window {
            return InPlace::Prepared(full_way(self, history, &mut edits, update));
        }
        self.calls_this_turn = self.calls_this_turn.saturating_add(1);
        self.last_request_tokens = request_tokens;
        InPlace::Applied(Applied {
            originals: edits,
            selected,
            request_tokens,
            update,
        })
    }

    /// The rest of [`before_request`](Self::before_request) once the
    /// engine's view (`view`, checked) is known.
    fn prepare_with(
        &mut self,
        history: &[Message],
        mut view: Option<Vec<Message>>,
        mut selected: bool,
        mut update: Update,
    ) -> Prepared {
        // Tokens of the request as it now stands, when already counted:
        // counting is the costly part of this hot path, so never twice.
        let mut measured = None;
        if !self.awaiting_usage {
            let request = view.as_deref().unwrap_or(history);
            let rough = self.counter.count_messages(request) as u64;
            measured = Some(rough);
            if self
                .engine
                .should_compress_preflight_counted(request, rough)
            {
                let tokens = match view {
                    Some(_) => self.counter.count_messages(history) as u64,
                    None => rough,
                };
                self.compact(
                    history,
                    tokens,
                    Trigger::Preflight,
                    self.automatic_request(),
                    &mut update,
                );
                let window = self.engine.state().context_length;
                if update
                    .missed
                    .as_ref()
                    .is_some_and(|m| m.kind == MissedKind::Deferred)
                    && window > 0
                    && rough > window
                {
                    // The prepared summary is not ready and the request
                    // would not fit at all: the deterministic summary now.
                    update.missed = None;
                    let request = CompressRequest::new().with_summary(SummarySource::Deterministic);
                    self.compact(history, tokens, Trigger::Preflight, request, &mut update);
                }
                if let Some(new) = &update.new_history {
                    (view, selected) = self.select(new, &mut update.notices);
                    measured = match (&view, &update.compaction) {
                        (None, Some(c)) => Some(c.tokens_after),
                        _ => None,
                    };
                }
            } else if !self.engine.should_defer_preflight_to_real_usage(rough) {
                let decision = self.engine.should_compress_info(Some(rough));
                if let Some(reason) = decision.block_reason {
                    held_back(&mut update, Trigger::Preflight, &reason);
                }
            }
        }
        let base = update.new_history.as_deref().unwrap_or(history);
        let mut request = view.unwrap_or_else(|| base.to_vec());
        let mut request_tokens =
            measured.unwrap_or_else(|| self.counter.count_messages(&request) as u64);
        // Never over the window: what compaction and selection left over
        // it is fitted (a view; the history keeps every original).
        let (mut steps, mut unfittable) = (Vec::new(), None);
        let window = self.engine.state().context_length;
        if window > 0 && request_tokens > window {
            let originals = originals_of(&request, base);
            match self.fit_request(&request, &originals, window) {
                Ok(fitted) => match self.check_output(base, &fitted.messages) {
                    Ok(()) => {
                        if !ledger_kept(&request, &fitted.messages) {
                            update.notices.push(Notice::warning(format!(
                                "{LEDGER_CUT}: the window ({window} tokens) cannot hold the \
                                 system prompt, the latest exchange and the summary's state \
                                 record, so this request carries the record cut to fit (the \
                                 history keeps it whole)"
                            )));
                        }
                        self.archive_left_out(&fitted, &originals, &mut update.notices);
                        request = fitted.messages;
                        request_tokens = fitted.tokens_after;
                        steps = fitted.steps;
                        selected = true;
                    }
                    Err(why) => update.notices.push(Notice::warning(format!(
                        "the request is over the window and its fitted form was rejected: {why}"
                    ))),
                },
                Err(e) => {
                    // Whether it is sent is the caller's decision
                    // (`Prepared::unfittable`): the notice says only what is.
                    update.notices.push(Notice::warning(format!(
                        "the request cannot fit the window: {e}"
                    )));
                    unfittable = Some(e);
                }
            }
        }
        self.calls_this_turn = self.calls_this_turn.saturating_add(1);
        self.last_request_tokens = request_tokens;
        Prepared {
            request,
            selected,
            request_tokens,
            update,
            fit: steps,
            unfittable,
        }
    }

    /// `request` fitted under the compaction threshold (room for the next
    /// turns), else under the `window` itself.
    fn fit_request(
        &self,
        request: &[Message],
        originals: &[Message],
        window: u64,
    ) -> Result<Fitted, Unfittable> {
        let threshold = self.engine.state().threshold_tokens;
        let counter = self.counter.as_ref();
        let profile = self.options.profile;
        let actions = &self.options.text_actions;
        // Under the threshold (room for the next turns), then under the
        // window; a fit that keeps the summary's state record whole is
        // taken before one that cuts it (the facts outrank the room).
        let mut budgets = vec![window];
        if threshold > 0 && threshold < window {
            budgets.insert(0, threshold);
        }
        // Without a store, no note: its handle would name nothing.
        let Some(_) = &self.store else {
            let mut first = None;
            for &budget in &budgets {
                match fit(request, budget, counter, profile, actions) {
                    Ok(f) if ledger_kept(request, &f.messages) => return Ok(f),
                    Ok(f) => first = first.or(Some(f)),
                    Err(_) => {}
                }
            }
            return match first {
                Some(f) => Ok(f),
                None => fit(request, window, counter, profile, actions),
            };
        };
        // The first that names what it left out with the asks among them,
        // else the handle alone; one that keeps the state record whole
        // before one that names its handle (a text-action agent cannot
        // follow a handle). A request that cannot fit under the threshold
        // may still fit the window: only the window says that no request
        // can fit.
        let mut candidates = Vec::new();
        for require_asks in [true, false] {
            for &budget in &budgets {
                if let Ok(f) = fit_noted(
                    request,
                    originals,
                    budget,
                    counter,
                    profile,
                    actions,
                    require_asks,
                ) {
                    let noted = f.left_out.is_empty() || f.archive_handle.is_some();
                    let ledger = ledger_kept(request, &f.messages);
                    if noted && ledger {
                        return Ok(f);
                    }
                    candidates.push((ledger, noted, f));
                }
            }
        }
        let pick = |want: fn(bool, bool) -> bool, c: &mut Vec<(bool, bool, Fitted)>| {
            c.iter()
                .position(|(l, n, _)| want(*l, *n))
                .map(|i| c.swap_remove(i).2)
        };
        let fallback = pick(|ledger, _| ledger, &mut candidates)
            .or_else(|| pick(|_, noted| noted, &mut candidates))
            .or_else(|| pick(|_, _| true, &mut candidates));
        match fallback {
            Some(f) => Ok(f),
            None => fit(request, window, counter, profile, actions),
        }
    }

    /// With a store, archives the originals of what the fitted request left
    /// out or cut, under the handle its note names, so nothing that leaves
    /// a request is lost (the history keeps them too; the archive is what
    /// the handle reaches after a later compaction). A store that cannot
    /// commit leaves the request as fitted, with a warning.
    fn archive_left_out(&self, fitted: &Fitted, originals: &[Message], notices: &mut Vec<Notice>) {
        if self.store.is_none() || fitted.left_out.is_empty() {
            return;
        }
        let gone: Vec<Message> = fitted
            .left_out
            .iter()
            .filter_map(|&i| originals.get(i).cloned())
            .collect();
        let (Some(&first), Some(&last)) = (fitted.left_out.first(), fitted.left_out.last()) else {
            return;
        };
        let mut batch = Batch::new();
        batch.archive_span(&gone, first, last + 1);
        if let Err(e) = self.commit(batch) {
            notices.push(Notice::warning(format!(
                "session store: cannot archive what the request left out to fit the window: {e}"
            )));
        }
    }

    /// Tokens of the request `history` would be sent as (after selection).
    pub(super) fn request_tokens(&mut self, history: &[Message]) -> u64 {
        let mut scratch = Vec::new();
        match self.select(history, &mut scratch).0 {
            Some(view) => self.counter.count_messages(&view) as u64,
            None => self.counter.count_messages(history) as u64,
        }
    }
}

/// The stored original of each message of `request` (a view of `history`):
/// a digested tool result's original is the history's result with the same
/// call id; any other message is its own.
pub(super) fn originals_of(request: &[Message], history: &[Message]) -> Vec<Message> {
    let by_id: std::collections::HashMap<&str, &Message> = history
        .iter()
        .filter(|m| m.is_tool_result())
        .filter_map(|m| Some((m.tool_call_id.as_deref()?, m)))
        .collect();
    request
        .iter()
        .map(|m| {
            m.tool_call_id
                .as_deref()
                .filter(|_| m.is_tool_result())
                .and_then(|id| by_id.get(id))
                .map_or_else(|| m.clone(), |&o| o.clone())
        })
        .collect()
}
