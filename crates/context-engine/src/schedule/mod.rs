//! Cache-aware scheduling: edit the early part of a request only when the
//! edit pays for the prompt cache it breaks.
//!
//! Providers bill a cached prompt prefix at a fraction of the input price
//! (see [`crate::pricing`]). Every change the engine makes to a request
//! invalidates the cache from the changed token on: the tokens after it are
//! sent (and written to the cache) again at the full price. A digest step,
//! a proactive prune or any other rewrite of old content therefore has a
//! price as well as a saving. The [`Scheduler`] weighs the two per
//! candidate [`Edit`]:
//!
//! - **break cost**: the tokens of the last request after the edit point
//!   that the new request still sends, times the miss premium (cache-write
//!   price less cached price);
//! - **saving**: the tokens the edit removes, times the cached price, over
//!   the calls expected before the window forces a compaction (the
//!   request's growth per call tells how many), capped at
//!   [`ScheduleOptions::max_horizon_calls`].
//!
//! An edit is applied when the saving pays for the break ([`Why::Pays`]),
//! when the cache is cold anyway because the last request is older than the
//! cache's lifetime ([`Why::Cold`]), and always when the window is at
//! stake ([`Why::Size`]): the request with the edit deferred would pass
//! [`ScheduleOptions::size_margin`] of the compaction threshold by the next
//! call. Otherwise it waits ([`Verdict::Defer`]), and since the saving of
//! pending steps accumulates while their break point stays put, several
//! steps are later applied at once.
//!
//! Compaction is weighed too ([`Scheduler::compaction_pays`]): before the
//! threshold only when the cost model says the cycle it starts is cheaper,
//! from [`ScheduleOptions::early_compaction_from`] (opt-in), or on a call
//! whose cache has expired, where the compaction breaks nothing, from
//! [`ScheduleOptions::cold_compaction_from`] (on by default). Times are
//! seconds since the Unix epoch: the host's for the call (a replay's
//! recorded time) or the wall clock, so that a state persisted by one
//! process reads right in another.
//!
//! The schedule's state ([`ScheduleState`]: how many tool batches are
//! frozen as digested, and what the last request was) is small and
//! serializable, so a host can persist it with the session; the digest's
//! prefix stability is kept by construction (a frozen batch stays digested
//! identically, see [`crate::digest::digest_through`]).
//!
//! With [`ScheduleOptions::enabled`] off, every edit is applied at once
//! ([`Why::EveryCall`]): the engine's behaviour before scheduling, kept as
//! the baseline `ctx replay` compares with.

mod apply;

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::config::ScheduleConfig;
use crate::pricing::PriceModel;

pub use apply::{ScheduledDigest, schedule_prune, scheduled_digest};

/// Scheduling switches and the prices they weigh.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ScheduleOptions {
    /// Off applies every edit at once (one digest step per call).
    pub enabled: bool,
    /// Prices and cache model (from `pricing.*` in the config).
    #[serde(skip)]
    pub price: PriceModel,
    /// The most calls a saving is counted over.
    pub max_horizon_calls: u32,
    /// An edit is forced when the request without it would reach this
    /// fraction of the compaction threshold by the next call.
    pub size_margin: f64,
    /// Compaction before the threshold, when the cost model says it pays
    /// ([`Scheduler::compaction_pays`]), once the request has reached this
    /// fraction of the threshold; 1 (or more, the default) compacts at the
    /// threshold only. Opt-in: each extra compaction summarizes the
    /// previous summary again, and in a long real-client run (Codex through
    /// `ctx serve`) the third one dropped a file name the task needed.
    pub early_compaction_from: f64,
    /// Compaction before the threshold on a call whose prompt cache has
    /// expired (the last request is older than the cache's lifetime), when
    /// the cost model says it pays, once the request has reached this
    /// fraction of the threshold; 1 (or more) turns it off. Such a call is
    /// sent uncached whether it compacts or not, so the compaction breaks
    /// nothing and the smaller request is cheaper from this call on: it
    /// pays as soon as its summary costs less than what it saves.
    pub cold_compaction_from: f64,
}

impl Default for ScheduleOptions {
    fn default() -> ScheduleOptions {
        ScheduleOptions::from_config(&ScheduleConfig::default(), PriceModel::default())
    }
}

impl ScheduleOptions {
    /// The options `context.schedule` sets, weighing `price`
    /// (`pricing.*`).
    pub fn from_config(config: &ScheduleConfig, price: PriceModel) -> ScheduleOptions {
        ScheduleOptions {
            enabled: config.enabled,
            price,
            max_horizon_calls: config.max_horizon_calls,
            size_margin: config.size_margin,
            early_compaction_from: config.early_compaction_from,
            cold_compaction_from: config.cold_compaction_from,
        }
    }
}

impl ScheduleOptions {
    /// The baseline: every edit applied at once.
    pub fn every_call() -> ScheduleOptions {
        ScheduleOptions {
            enabled: false,
            ..ScheduleOptions::default()
        }
    }

    /// Sets [`price`](Self::price).
    pub fn with_price(mut self, price: PriceModel) -> ScheduleOptions {
        self.price = price;
        self
    }
}

/// What the schedule remembers between calls. Serializable: a host that
/// persists a session persists this with it (an engine exposes it in its
/// status under `schedule`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ScheduleState {
    /// Tool batches, counted from the start of the history, whose results
    /// are digested in every request; later ones are whole until the
    /// schedule advances.
    pub digested_batches: usize,
    /// A hash of the message that opens the last digested batch: when it no
    /// longer matches, the history was rewritten (compaction, prune) and the
    /// cache broke there anyway.
    pub anchor: Option<u64>,
    /// Prompt tokens of the last request.
    pub last_request_tokens: u64,
    /// When the last request was sent, in seconds since the Unix epoch.
    /// Persisted as `last_request_unix`: a state written before the rename
    /// (when the engine kept its process's monotonic seconds here) reads as
    /// unknown, never as a cold cache.
    #[serde(rename = "last_request_unix")]
    pub last_request_at: Option<f64>,
    /// Average growth of the request per call, in tokens.
    pub growth_per_call: u64,
}

/// A candidate rewrite of the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edit {
    /// Tokens of the request before the first changed token.
    pub at_tokens: u64,
    /// Tokens the edit removes from the request.
    pub saved_tokens: u64,
    /// Tokens of the request with the edit applied.
    pub request_tokens: u64,
}

/// What a compaction the engine could run now would cost and leave, for
/// [`Scheduler::compaction_pays`]. Tokens as the request counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactionEstimate {
    /// Tokens of the request now.
    pub request_tokens: u64,
    /// Tokens of the request's head the compaction keeps as it is (the
    /// system prompt and what is pinned after it): still cached after it.
    pub head_tokens: u64,
    /// Tokens of the request right after it: head, summary, tail.
    pub after_tokens: u64,
    /// Tokens of the summary it writes.
    pub summary_tokens: u64,
    /// Tokens a summarizer billed at the session's prices reads for it
    /// (0 for a local one).
    pub summarizer_input_tokens: u64,
    /// Tokens that summarizer writes (0 for a local one).
    pub summarizer_output_tokens: u64,
}

/// Why an edit is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// Scheduling is off.
    EveryCall,
    /// The edit changes nothing the cache holds, or saves nothing.
    Free,
    /// The saving over the expected calls pays for the broken cache.
    Pays,
    /// The cache expired since the last request.
    Cold,
    /// The window is at stake.
    Size,
    /// The history was rewritten under the schedule (compaction, prune):
    /// the cache broke there already.
    Rewritten,
}

/// The schedule's answer for one edit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Apply it now.
    Apply(Why),
    /// Keep the cache; ask again next call.
    Defer,
}

impl Verdict {
    /// Whether the edit is applied.
    pub fn applies(self) -> bool {
        matches!(self, Verdict::Apply(_))
    }
}

/// The scheduler of one session.
#[derive(Clone, Debug, Default)]
pub struct Scheduler {
    options: ScheduleOptions,
    state: ScheduleState,
}

impl Scheduler {
    /// A scheduler with a fresh state.
    pub fn new(options: ScheduleOptions) -> Scheduler {
        Scheduler {
            options,
            state: ScheduleState::default(),
        }
    }

    /// The options.
    pub fn options(&self) -> &ScheduleOptions {
        &self.options
    }

    /// The state to persist.
    pub fn state(&self) -> &ScheduleState {
        &self.state
    }

    /// The state, to change (the digest advances its frontier here).
    pub fn state_mut(&mut self) -> &mut ScheduleState {
        &mut self.state
    }

    /// Restores a persisted state.
    pub fn restore(&mut self, state: ScheduleState) {
        self.state = state;
    }

    /// Forgets everything (a new session).
    pub fn reset(&mut self) {
        self.state = ScheduleState::default();
    }

    /// Whether `edit` is applied now, for a session whose compaction
    /// threshold is `threshold_tokens`, at `now` (seconds since the Unix
    /// epoch; see [`now`]).
    pub fn decide(&self, edit: &Edit, threshold_tokens: u64, now: Option<f64>) -> Verdict {
        if !self.options.enabled {
            return Verdict::Apply(Why::EveryCall);
        }
        let s = &self.state;
        let kept_after = s
            .last_request_tokens
            .saturating_sub(edit.at_tokens.saturating_add(edit.saved_tokens));
        if edit.saved_tokens == 0 || kept_after == 0 {
            return Verdict::Apply(Why::Free);
        }
        if self.is_cold(now) {
            return Verdict::Apply(Why::Cold);
        }
        let deferred = edit.request_tokens.saturating_add(edit.saved_tokens);
        let next = deferred.saturating_add(s.growth_per_call);
        if threshold_tokens > 0 && next as f64 >= self.options.size_margin * threshold_tokens as f64
        {
            return Verdict::Apply(Why::Size);
        }
        let room = threshold_tokens.saturating_sub(deferred);
        let horizon = (room / s.growth_per_call.max(1))
            .clamp(1, u64::from(self.options.max_horizon_calls.max(1)));
        let price = &self.options.price;
        let saving = edit.saved_tokens as f64 * price.cached_per_token() * horizon as f64;
        let cost = kept_after as f64 * price.miss_premium_per_token();
        if saving >= cost {
            Verdict::Apply(Why::Pays)
        } else {
            Verdict::Defer
        }
    }

    /// Whether compacting now, before the threshold, costs less over the
    /// session than waiting for it: the economic order quantity of the
    /// compaction cycle. A compaction has a fixed cost `F` (the tail sent
    /// again uncached, the summary written, the summarizer's own call when
    /// it is billed); between compactions every call reads the growth since
    /// the last one from the cache, `c` per token. With the request growing
    /// `g` tokens per call from the size `S` a compaction leaves, a cycle of
    /// `n` calls costs `F + c g n^2 / 2` beyond `S`, which per call is least
    /// when `c (X - S)^2 / (2 g) = F`, `X` the request at compaction. So a
    /// compaction pays once the growth since `S` has cost that much: then
    /// the next cycle starts smaller and the session pays less per call,
    /// breaks included. Never before [`ScheduleOptions::early_compaction_from`]
    /// of the threshold, nor with the schedule off, nor before the growth
    /// per call is known.
    ///
    /// On a `cold` call (the cache expired before it, see
    /// [`is_cold`](Self::is_cold)) the whole request is sent uncached
    /// either way: the tail costs nothing more, and the call itself saves
    /// what the compaction removes at the cache-write price. There the
    /// floor is [`ScheduleOptions::cold_compaction_from`] (the lower of the
    /// two).
    pub fn compaction_pays(
        &self,
        e: &CompactionEstimate,
        threshold_tokens: u64,
        cold: bool,
    ) -> bool {
        let o = &self.options;
        let g = self.state.growth_per_call;
        // The floor is 1 with the schedule off.
        let from = self.compaction_floor(cold);
        if threshold_tokens == 0
            || g == 0
            || from >= 1.0
            || (e.request_tokens as f64) < from * threshold_tokens as f64
            || e.after_tokens >= e.request_tokens
        {
            return false;
        }
        let p = &o.price;
        let per = |m: f64| m / 1_000_000.0;
        let summarizer = e.summarizer_input_tokens as f64 * per(p.input_per_million)
            + e.summarizer_output_tokens as f64 * per(p.output_per_million);
        let grown = (e.request_tokens - e.after_tokens) as f64;
        // Cold: both requests are written to the cache whole, so the
        // compaction costs its summarizer only and saves its net size now.
        let (fixed, now_saved) = if cold {
            (summarizer, grown * per(p.cache_write_per_million))
        } else {
            let resent = e
                .after_tokens
                .saturating_sub(e.head_tokens)
                .saturating_sub(e.summary_tokens);
            let fixed = resent as f64 * p.miss_premium_per_token()
                + e.summary_tokens as f64 * per(p.cache_write_per_million)
                + summarizer;
            (fixed, 0.0)
        };
        // Under the cache's minimum prefix nothing is read from it: every
        // call pays the growth at the input price.
        let carry = if e.request_tokens < p.cache.min_prefix_tokens {
            per(p.input_per_million)
        } else {
            p.cached_per_token()
        };
        now_saved + carry * grown * grown / (2.0 * g as f64) >= fixed
    }

    /// The fraction of the threshold under which no compaction runs early:
    /// [`ScheduleOptions::early_compaction_from`], or on a `cold` call the
    /// lower [`ScheduleOptions::cold_compaction_from`]; 1 or more when none
    /// may (or the schedule is off).
    pub fn compaction_floor(&self, cold: bool) -> f64 {
        let o = &self.options;
        if !o.enabled {
            1.0
        } else if cold {
            o.early_compaction_from.min(o.cold_compaction_from)
        } else {
            o.early_compaction_from
        }
    }

    /// Whether the prompt cache has expired since the last request
    /// recorded: `now` (seconds since the Unix epoch) is more than the
    /// cache's lifetime after it. Unknown times are warm. Ask before the
    /// coming request is recorded ([`record_request`](Self::record_request)).
    pub fn is_cold(&self, now: Option<f64>) -> bool {
        match (now, self.state.last_request_at) {
            (Some(now), Some(last)) => now - last > self.options.price.cache.lifetime_secs as f64,
            _ => false,
        }
    }

    /// Records the request sent: its size and time, and the growth since
    /// the previous one.
    pub fn record_request(&mut self, request_tokens: u64, now: Option<f64>) {
        let s = &mut self.state;
        if s.last_request_tokens > 0 && request_tokens > s.last_request_tokens {
            let growth = request_tokens - s.last_request_tokens;
            // An average that follows the session's pace without letting
            // one huge tool output dominate.
            s.growth_per_call = if s.growth_per_call == 0 {
                growth
            } else {
                (s.growth_per_call * 3 + growth) / 4
            };
        }
        s.last_request_tokens = request_tokens;
        s.last_request_at = now.or(s.last_request_at);
    }
}

/// The wall clock in seconds since the Unix epoch (`None` if the clock is
/// before it).
pub fn now() -> Option<f64> {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scheduler with early compaction on from half the threshold.
    fn scheduler(last: u64, growth: u64) -> Scheduler {
        let mut s = Scheduler::new(ScheduleOptions {
            early_compaction_from: 0.5,
            ..ScheduleOptions::default()
        });
        s.state.last_request_tokens = last;
        s.state.growth_per_call = growth;
        s.state.last_request_at = Some(1000.0);
        s
    }

    /// The verdict on an edit at `at` tokens saving `saved`, leaving a
    /// `request`-token request, under `threshold`, `after` seconds since
    /// the last request.
    fn verdict(s: &Scheduler, [at, saved, request, threshold]: [u64; 4], after: f64) -> Verdict {
        let edit = Edit {
            at_tokens: at,
            saved_tokens: saved,
            request_tokens: request,
        };
        s.decide(&edit, threshold, Some(1000.0 + after))
    }

    #[test]
    fn a_step_that_breaks_nothing_cached_is_free() {
        // The newest batch turned old: nothing of the last request follows it.
        let s = scheduler(10_000, 500);
        let free = verdict(&s, [6_000, 4_000, 6_100, 100_000], 1.0);
        assert_eq!(free, Verdict::Apply(Why::Free));
    }

    #[test]
    fn a_small_saving_deep_in_the_prefix_waits_and_pays_once_accumulated() {
        let s = scheduler(50_000, 500);
        // 200 tokens saved at 10k: 40k cached tokens would be re-sent.
        let small = [10_000, 200, 50_300, 100_000];
        assert_eq!(verdict(&s, small, 1.0), Verdict::Defer);
        // The same break point with 8k accumulated: 8k x 0.5 x 24 >= 32k x 1.5.
        let big = [10_000, 8_000, 42_500, 100_000];
        assert_eq!(verdict(&s, big, 1.0), Verdict::Apply(Why::Pays));
    }

    #[test]
    fn size_wins_near_the_threshold_and_a_cold_cache_applies_at_once() {
        let s = scheduler(50_000, 2_000);
        let near = [10_000, 200, 50_300, 56_000];
        assert_eq!(verdict(&s, near, 1.0), Verdict::Apply(Why::Size));
        let far = [10_000, 200, 50_300, 100_000];
        assert_eq!(verdict(&s, far, 301.0), Verdict::Apply(Why::Cold));
        let off = Scheduler::new(ScheduleOptions::every_call());
        assert_eq!(verdict(&off, far, 1.0), Verdict::Apply(Why::EveryCall));
    }

    fn estimate(request: u64) -> CompactionEstimate {
        CompactionEstimate {
            request_tokens: request,
            head_tokens: 1_500,
            after_tokens: 5_000,
            summary_tokens: 800,
            ..CompactionEstimate::default()
        }
    }

    #[test]
    fn an_early_compaction_waits_until_the_growth_has_cost_what_it_costs() {
        // OpenAI: F = 2,700 x 1.5 + 800 x 2.0 = 5,650 per million; growth
        // 500 a call: pays once 0.5 x d^2 / 1,000 >= 5,650, d >= 3,362.
        let s = scheduler(8_000, 500);
        assert!(!s.compaction_pays(&estimate(8_300), 16_000, false));
        assert!(s.compaction_pays(&estimate(8_400), 16_000, false));
        // Off by default: compaction at the threshold only.
        let mut default = Scheduler::new(ScheduleOptions::default());
        default.state = s.state.clone();
        assert!(!default.compaction_pays(&estimate(15_000), 16_000, false));
        // Never under the floor (half the threshold), with the schedule
        // off, or before the growth is known.
        assert!(!s.compaction_pays(&estimate(8_400), 40_000, false));
        let off = Scheduler::new(ScheduleOptions::every_call());
        assert!(!off.compaction_pays(&estimate(15_000), 20_000, false));
        assert!(!scheduler(8_000, 0).compaction_pays(&estimate(15_000), 20_000, false));
        // A summarizer billed at the session's prices makes it wait longer.
        let billed = CompactionEstimate {
            summarizer_input_tokens: 3_000,
            summarizer_output_tokens: 800,
            ..estimate(8_400)
        };
        assert!(!s.compaction_pays(&billed, 16_000, false));
        // Anthropic's cheap reads and dear writes: later still (F =
        // 2,700 x 3.45 + 800 x 3.75, d >= 6,407).
        let mut anthropic = scheduler(8_000, 500);
        anthropic.options.price = PriceModel::preset("anthropic").unwrap();
        assert!(!anthropic.compaction_pays(&estimate(11_000), 16_000, false));
        assert!(anthropic.compaction_pays(&estimate(11_500), 16_000, false));
    }

    #[test]
    fn a_cold_call_compacts_from_its_own_floor_when_the_summary_costs_less_than_it_saves() {
        // Early compaction off (the default), cold compaction from half
        // the threshold: 8,400 of 16,000 would wait warm, compacts cold
        // (the extractive summarizer costs nothing; 3,400 tokens saved).
        let mut s = Scheduler::new(ScheduleOptions::default());
        s.state.last_request_tokens = 8_000;
        s.state.growth_per_call = 500;
        s.state.last_request_at = Some(1000.0);
        assert!(!s.compaction_pays(&estimate(8_400), 16_000, false));
        assert!(s.compaction_pays(&estimate(8_400), 16_000, true));
        assert!(s.is_cold(Some(1400.0)) && !s.is_cold(Some(1001.0)) && !s.is_cold(None));
        // Never under its floor.
        assert!(!s.compaction_pays(&estimate(7_900), 16_000, true));
        // A billed summarizer that reads more than the call saves waits:
        // 3,400 tokens saved at $2 now (and the smaller request's reads
        // after) against 20,000 read at $2 and 800 written at $8.
        let billed = CompactionEstimate {
            summarizer_input_tokens: 20_000,
            summarizer_output_tokens: 800,
            ..estimate(8_400)
        };
        assert!(!s.compaction_pays(&billed, 16_000, true));
        // Turned off, or the schedule off.
        s.options.cold_compaction_from = 1.0;
        assert!(!s.compaction_pays(&estimate(8_400), 16_000, true));
        assert_eq!(s.compaction_floor(true), 1.0);
        let mut off = Scheduler::new(ScheduleOptions::every_call());
        off.state = s.state.clone();
        assert_eq!(off.compaction_floor(true), 1.0);
        assert!(!off.compaction_pays(&estimate(8_400), 16_000, true));
        // An hour's cache is still warm after ten minutes.
        let mut hour = Scheduler::new(
            ScheduleOptions::default().with_price(PriceModel::preset("anthropic-1h").unwrap()),
        );
        hour.state = s.state.clone();
        assert!(!hour.is_cold(Some(1600.0)));
    }

    #[test]
    fn the_state_round_trips_through_json_and_growth_is_averaged() {
        let mut s = Scheduler::new(ScheduleOptions::default());
        s.record_request(1_000, Some(1.0));
        s.record_request(2_000, Some(2.0));
        s.record_request(2_400, Some(3.0));
        assert_eq!(s.state().growth_per_call, (1_000 * 3 + 400) / 4);
        let json = serde_json::to_string(s.state()).unwrap();
        let back: ScheduleState = serde_json::from_str(&json).unwrap();
        assert_eq!(&back, s.state());
    }
}
