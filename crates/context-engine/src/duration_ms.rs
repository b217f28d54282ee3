//! Durations in reports: milliseconds as a float (`"latency_ms": 12.5`),
//! for `#[serde(serialize_with = "crate::duration_ms::serialize")]`.

use std::time::Duration;

/// Serializes `d` as milliseconds.
pub(crate) fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}
