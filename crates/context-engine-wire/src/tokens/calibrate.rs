//! How far our counts are from what the provider billed.
//!
//! Agents such as mini-swe-agent store each model response, usage included,
//! on the assistant message it produced. The request behind assistant message
//! `i` was `messages[..i]`, so every such message is a measured data point.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::TokenCounter;
use crate::message::Message;

/// Why no calibration could be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CalibrationError {
    /// No message carries provider usage, so there is nothing to compare.
    #[error("none of the {messages} messages records provider usage (`prompt_tokens`)")]
    NoRecordedUsage {
        /// How many messages were searched.
        messages: usize,
    },
}

/// One model call: our count of its request against the provider's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalibrationPoint {
    /// Index of the assistant message that answered the call; the request
    /// was the messages before it.
    pub index: usize,
    /// Our count of `messages[..index]`.
    pub counted: u64,
    /// The provider's `prompt_tokens`.
    pub reported: u64,
}

/// Error of our counts against the provider's, over all recorded calls.
/// Errors are `counted - reported`; percentages are of `reported`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationReport {
    /// Number of calls with recorded usage.
    pub calls: usize,
    /// Mean of `counted - reported`, in tokens (negative: we under-count).
    pub mean_signed_error: f64,
    /// Mean of `|counted - reported| / reported`, in percent.
    pub mean_abs_pct_error: f64,
    /// Largest `|counted - reported| / reported`, in percent.
    pub max_abs_pct_error: f64,
    /// Median of `reported - counted`: the constant the provider adds that a
    /// transcript does not show (tool schemas, its own template).
    pub median_offset: f64,
    /// Mean absolute percent error of `counted + median_offset`.
    pub mean_abs_pct_error_after_offset: f64,
    /// Largest absolute percent error of `counted + median_offset`.
    pub max_abs_pct_error_after_offset: f64,
    /// Least-squares fit `reported ≈ fit_intercept + fit_slope * counted`.
    /// The slope shows a tokenizer that splits more finely than ours (a
    /// value for [`super::CountOptions::unknown_model_factor`]); the
    /// intercept is the constant part, without the drift the median offset
    /// absorbs. Both 0 and 1 when fewer than two distinct counts exist.
    pub fit_intercept: f64,
    /// See `fit_intercept`.
    pub fit_slope: f64,
    /// Mean absolute percent error of the fitted line.
    pub mean_abs_pct_error_after_fit: f64,
    /// Every call, in transcript order.
    pub points: Vec<CalibrationPoint>,
}

fn path<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().try_fold(v, |v, k| v.get(k))
}

/// The usage objects a message may carry, most specific first: mini-swe-agent
/// keeps `{"extra": {"response": {"usage"}}}`; other recorders put `usage`
/// under `extra` or on the message itself.
fn usage_candidates(m: &Message) -> impl Iterator<Item = &Value> {
    const PATHS: &[&[&str]] = &[
        &["extra", "response", "usage"],
        &["extra", "usage"],
        &["response", "usage"],
        &["usage"],
    ];
    PATHS.iter().filter_map(|p| {
        let (first, rest) = p.split_first()?;
        path(m.extra.get(*first)?, rest)
    })
}

/// The provider-reported prompt size of the call that produced `m`, if the
/// transcript recorded it (`prompt_tokens`, or `input_tokens` as the
/// Responses and Anthropic APIs name it).
pub fn recorded_prompt_tokens(m: &Message) -> Option<u64> {
    usage_candidates(m).find_map(|u| {
        u.get("prompt_tokens")
            .or_else(|| u.get("input_tokens"))
            .and_then(Value::as_u64)
    })
}

/// The model the provider said answered the call that produced `m`, so that
/// calibration can pick the matching tokenizer.
pub fn recorded_model(m: &Message) -> Option<&str> {
    const PATHS: &[&[&str]] = &[&["extra", "response", "model"], &["response", "model"]];
    PATHS.iter().find_map(|p| {
        let (first, rest) = p.split_first()?;
        path(m.extra.get(*first)?, rest)?.as_str()
    })
}

fn pct(err: f64, reported: u64) -> f64 {
    100.0 * err.abs() / reported.max(1) as f64
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => xs[n / 2],
        _ => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// Ordinary least squares of `reported` on `counted`: (intercept, slope).
fn fit_line(points: &[CalibrationPoint]) -> (f64, f64) {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.counted as f64).sum::<f64>() / n;
    let my = points.iter().map(|p| p.reported as f64).sum::<f64>() / n;
    let (sxy, sxx) = points.iter().fold((0.0, 0.0), |(sxy, sxx), p| {
        let dx = p.counted as f64 - mx;
        (sxy + dx * (p.reported as f64 - my), sxx + dx * dx)
    });
    if sxx == 0.0 {
        return (my - mx, 1.0);
    }
    let slope = sxy / sxx;
    (my - slope * mx, slope)
}

/// Compares `counter` with every recorded call in `messages`.
///
/// The request of call `i` is counted as the sum of
/// [`TokenCounter::count_message`] over `messages[..i]` plus
/// [`TokenCounter::request_overhead`] (what the default
/// [`TokenCounter::count_messages`] does), computed as running sums so the
/// whole calibration counts each message once.
pub fn calibrate(
    counter: &dyn TokenCounter,
    messages: &[Message],
) -> Result<CalibrationReport, CalibrationError> {
    let mut points = Vec::new();
    let mut prefix = counter.request_overhead() as u64;
    for (index, m) in messages.iter().enumerate() {
        if let Some(reported) = recorded_prompt_tokens(m) {
            points.push(CalibrationPoint {
                index,
                counted: prefix,
                reported,
            });
        }
        prefix += counter.count_message(m) as u64;
    }
    if points.is_empty() {
        return Err(CalibrationError::NoRecordedUsage {
            messages: messages.len(),
        });
    }
    let n = points.len() as f64;
    let signed: Vec<f64> = points
        .iter()
        .map(|p| p.counted as f64 - p.reported as f64)
        .collect();
    let offset = median(signed.iter().map(|e| -e).collect());
    let abs_pct = |shift: f64| -> Vec<f64> {
        points
            .iter()
            .zip(&signed)
            .map(|(p, e)| pct(e + shift, p.reported))
            .collect()
    };
    let (intercept, slope) = fit_line(&points);
    let fitted: Vec<f64> = points
        .iter()
        .map(|p| {
            pct(
                intercept + slope * p.counted as f64 - p.reported as f64,
                p.reported,
            )
        })
        .collect();
    let before = abs_pct(0.0);
    let after = abs_pct(offset);
    let max = |xs: &[f64]| xs.iter().copied().fold(0.0, f64::max);
    Ok(CalibrationReport {
        calls: points.len(),
        mean_signed_error: signed.iter().sum::<f64>() / n,
        mean_abs_pct_error: before.iter().sum::<f64>() / n,
        max_abs_pct_error: max(&before),
        median_offset: offset,
        mean_abs_pct_error_after_offset: after.iter().sum::<f64>() / n,
        max_abs_pct_error_after_offset: max(&after),
        fit_intercept: intercept,
        fit_slope: slope,
        mean_abs_pct_error_after_fit: fitted.iter().sum::<f64>() / n,
        points,
    })
}
