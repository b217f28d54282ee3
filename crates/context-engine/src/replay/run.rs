//! One replay under way ([`Run`]): the state a replay carries from call to
//! call, each call's steps, and the report at the end.

use super::*;

/// A replay under way: what it reads and what it has gathered so far.
pub(super) struct Run<'a> {
    pub(super) recording: &'a [Message],
    pub(super) counter: &'a dyn TokenCounter,
    pub(super) options: &'a ReplayOptions,
    pub(super) context_length: u64,
    pub(super) reentry: Vec<bool>,
    pub(super) history: Vec<Message>,
    pub(super) unmanaged_tokens: u64,
    pub(super) cursor: usize,
    pub(super) cache: PromptCache,
    pub(super) unmanaged_cache: PromptCache,
    pub(super) calls: Vec<CallRecord>,
    pub(super) compaction_views: Vec<CompactionView>,
    pub(super) last_sent_at: Option<f64>,
}

impl Run<'_> {
    /// Call `call`, answered by `recording[index]`: what arrived since the
    /// last one, the request the engine makes, the answer fed back; its
    /// record is kept and its request returned.
    pub(super) fn call(
        &mut self,
        session: &mut Session,
        call: usize,
        index: usize,
    ) -> Vec<Message> {
        let (recording, counter, options) = (self.recording, self.counter, self.options);
        let mut engine_time = Duration::ZERO;
        let mut pruned = 0;
        let mut compaction = None;
        let mut notices = Vec::new();
        let mut missed = None;
        // The engine's self.cache rules run on the recording's time (its idle
        // gaps), not on the replay's. A call without one, in a recording
        // that has times, was made when the last one was: no gap is made up
        // (the wall clock is not the recording's).
        let sent_at =
            call_time(recording, &options.message_times, self.cursor, index).or(self.last_sent_at);
        self.last_sent_at = sent_at;
        session.set_call_time(sent_at);

        // What arrived since the last call: tool results first (the agent
        // ran the tools), then maybe a new user turn.
        let segment = &recording[self.cursor..index];
        let tools_end = segment
            .iter()
            .enumerate()
            .position(|(k, m)| !(m.is_tool_result() || self.reentry[self.cursor + k]))
            .unwrap_or(segment.len());
        let (tools, rest) = segment.split_at(tools_end);
        if call > 0 && !tools.is_empty() {
            self.history.extend_from_slice(tools);
            let started = Instant::now();
            let update = session.after_tools(&self.history);
            engine_time += started.elapsed();
            pruned += update.pruned;
            notices.extend(update.notices);
            missed = update.missed.or(missed);
            if let Some(new) = update.new_history {
                self.history = new;
            }
            if update.compaction.is_some() {
                compaction = update.compaction;
            }
        } else {
            self.history.extend_from_slice(tools);
        }
        let rest_from = self.cursor + tools_end;
        if call > 0
            && (rest_from..index).any(|k| is_real_user_turn(recording, k, &options.text_actions))
        {
            session.turn_complete(&self.history, &Default::default());
        }
        self.history.extend_from_slice(rest);
        for m in segment {
            self.unmanaged_tokens += counter.count_message(m) as u64;
        }

        let started = Instant::now();
        let prepared = session.before_request(&self.history);
        engine_time += started.elapsed();
        notices.extend(prepared.update.notices);
        missed = prepared.update.missed.or(missed);
        if let Some(new) = prepared.update.new_history {
            self.history = new;
        }
        if prepared.update.compaction.is_some() {
            compaction = prepared.update.compaction;
        }
        let request = prepared.request;
        let tokens_with_engine = prepared.request_tokens;
        let over_window = prepared.unfittable.is_none()
            && self.context_length > 0
            && tokens_with_engine > self.context_length;
        let unmanaged = &recording[..index];
        let violations_introduced =
            usize::from(introduced_violation(unmanaged, &request, options.profile).is_some());

        // Only a breakpoint self.cache reads the marks.
        let stable = if options.price.cache.automatic {
            request.len()
        } else {
            session.stable_prefix(&request)
        };
        let marks = cache_marks(&request, stable);
        let hit = self
            .cache
            .lookup_and_store(&request, &marks, sent_at, counter);
        let cache_hit_tokens = hit.hit_tokens;
        let cache_broke = hit.resent_tokens > 0 || hit.expired;
        let unmanaged_marks = cache_marks(unmanaged, unmanaged.len());
        let unmanaged_hit =
            self.unmanaged_cache
                .lookup_and_store(unmanaged, &unmanaged_marks, sent_at, counter);

        let answer = &recording[index];
        let recorded = recorded_prompt_tokens(answer);
        let completion_tokens = recorded_completion_tokens(answer)
            .unwrap_or_else(|| counter.count_message(answer) as u64);
        // The provider's count is for the unmanaged request; scale it to
        // the request the engine made, so the engine sees what the provider
        // would have reported for it.
        let prompt_for_engine = scaled_prompt(recorded, self.unmanaged_tokens, tokens_with_engine);
        self.history.push(answer.clone());
        let unmanaged_before_answer = self.unmanaged_tokens;
        self.unmanaged_tokens += counter.count_message(answer) as u64;
        let started = Instant::now();
        session.after_response(&Usage::new(prompt_for_engine, completion_tokens));
        engine_time += started.elapsed();
        self.cursor = index + 1;

        if compaction.is_some() {
            self.compaction_views.push(CompactionView {
                call,
                seen: index,
                request: request.clone(),
                history: self.history[..self.history.len() - 1].to_vec(),
                records_numbered: session.records_numbered(),
            });
        }
        self.calls.push(CallRecord {
            call,
            message_index: index,
            tokens_without_engine: unmanaged_before_answer,
            tokens_with_engine,
            recorded_prompt_tokens: recorded,
            completion_tokens,
            cache_hit_tokens,
            cache_hit_tokens_without_engine: unmanaged_hit.hit_tokens,
            cache_written_tokens: hit.written_tokens,
            cache_written_tokens_without_engine: unmanaged_hit.written_tokens,
            cache_resent_tokens: hit.resent_tokens,
            cache_reusable_tokens: hit.common_tokens + hit.resent_tokens,
            cache_reusable_tokens_without_engine: unmanaged_hit.common_tokens
                + unmanaged_hit.resent_tokens,
            cache_broke,
            cache_expired: hit.expired,
            sent_at,
            compaction,
            pruned,
            selected: prepared.selected,
            messages_with_engine: request.len(),
            violations_introduced,
            over_window,
            fit: prepared.fit,
            unfittable: prepared.unfittable,
            engine_time,
            notices,
            missed_compaction: missed,
        });
        request
    }

    /// The report of the finished run (`final_request`: the last call's).
    pub(super) fn report(
        self,
        session: &Session,
        threshold_tokens: u64,
        final_request: Vec<Message>,
    ) -> ReplayReport {
        let Run {
            recording,
            options,
            context_length,
            history,
            calls,
            compaction_views,
            ..
        } = self;
        let totals = totals(&calls, &options.price);
        let probes = extract_probes(recording, &options.text_actions);
        let seen = |n: usize| -> Vec<Probe> {
            probes
                .iter()
                .filter(|p| p.source_index < n)
                .cloned()
                .collect()
        };
        let last_seen = calls.last().map_or(0, |c| c.message_index);
        // With a store, what the request reaches through the handles it names
        // is recallable (for an agent that can call the engine's tools); the
        // archive only grows, so the final one serves the earlier checks too
        // (a handle names the same content forever).
        let channel = ToolChannel::of(recording, &options.text_actions);
        let mut reach = session
            .store()
            .filter(|_| channel.calls_tools())
            .and_then(|s| crate::store::Reach::new(s.as_ref(), session.id()).ok());
        let mut archived = |view: &[Message]| -> Vec<Message> {
            reach
                .as_mut()
                .and_then(|r| r.from(view).ok())
                .unwrap_or_default()
        };
        let retention = check_with_archive(
            &seen(last_seen),
            &final_request,
            &history,
            &archived(&final_request),
            channel,
        );
        let store = session.store().cloned();
        let compactions = compaction_views
            .iter()
            .filter_map(|v| {
                let compaction = calls.get(v.call)?.compaction.clone()?;
                let first = v
                    .records_numbered
                    .saturating_sub(u64::from(compaction.passes))
                    + 1;
                // The report shows what the store holds; a store that cannot
                // read it back leaves the list empty (the replay's figures do
                // not depend on it).
                let archive = store
                    .as_ref()
                    .and_then(|s| {
                        archived_compactions(s.as_ref(), session.id(), first..=v.records_numbered)
                            .ok()
                    })
                    .unwrap_or_default();
                Some(CompactionRecord {
                    call: v.call,
                    retention: check_with_archive(
                        &seen(v.seen),
                        &v.request,
                        &v.history,
                        &archived(&v.request),
                        channel,
                    ),
                    summary: v
                        .request
                        .iter()
                        .filter(|m| is_summary(m))
                        .cloned()
                        .collect(),
                    archived: archive,
                    compaction,
                })
            })
            .collect();
        ReplayReport {
            engine: session.engine().name().to_owned(),
            context_length,
            threshold_tokens,
            price: options.price.clone(),
            totals,
            costs: None,
            retention,
            compactions,
            calls,
            final_request,
            final_history: history,
            compaction_views,
        }
    }
}
