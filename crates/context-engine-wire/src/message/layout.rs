//! Key-order bookkeeping shared by the lossless record types.
//!
//! A record (message, tool call, function call) has a few typed fields and an
//! `extra` map for everything else. To give back the exact JSON it was read
//! from, it remembers the order in which keys arrived: each slot is either a
//! typed field or "the next key of `extra`". Serialization walks the slots, so
//! key order survives; fields set or keys added later are written after them.

use serde::ser::SerializeMap;
use serde_json::{Map, Value};

/// One position in the original key order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// The typed field with this index in [`Record::FIELDS`].
    Known(u8),
    /// The next entry of the `extra` map.
    Extra,
}

/// Original key order of one record. Empty for records built in code.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Layout(Vec<Slot>);

/// A JSON object with typed fields plus an `extra` map.
pub(crate) trait Record {
    /// Names of the typed fields, in canonical output order.
    const FIELDS: &'static [&'static str];

    /// Offers `value` to typed field `index`. Gives it back when it does not
    /// fit the field's type, so that it is kept verbatim in `extra`.
    fn take(&mut self, index: usize, value: Value) -> Result<(), Value>;

    /// Writes typed field `index` if it is set; returns whether it was.
    fn emit<M: SerializeMap>(&self, index: usize, map: &mut M) -> Result<bool, M::Error>;

    /// Whether typed field `index` is set (so an `extra` key of the same name
    /// must not be written too).
    fn is_set(&self, index: usize) -> bool;

    fn extra(&self) -> &Map<String, Value>;
    fn extra_mut(&mut self) -> &mut Map<String, Value>;
    fn layout(&self) -> &Layout;
    fn layout_mut(&mut self) -> &mut Layout;
}

/// Fills `record` from the entries of a JSON object, remembering their order.
pub(crate) fn fill<R: Record>(record: &mut R, object: Map<String, Value>) {
    let mut slots = Vec::with_capacity(object.len());
    for (key, value) in object {
        let slot = match R::FIELDS.iter().position(|f| *f == key) {
            Some(index) => match record.take(index, value) {
                Ok(()) => Slot::Known(index as u8),
                Err(value) => {
                    record.extra_mut().insert(key, value);
                    Slot::Extra
                }
            },
            None => {
                record.extra_mut().insert(key, value);
                Slot::Extra
            }
        };
        slots.push(slot);
    }
    record.layout_mut().0 = slots;
}

/// Serializes `record` in its original key order (see the module docs).
pub(crate) fn serialize<R: Record, S: serde::Serializer>(
    record: &R,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(None)?;
    const { assert!(R::FIELDS.len() <= 16) };
    let mut written = [false; 16];
    // An `extra` key that shadows a set typed field is stale (the field was
    // set after loading): the typed value is written in its place.
    let shadowing = |key: &str| {
        R::FIELDS
            .iter()
            .position(|f| *f == key)
            .filter(|&i| record.is_set(i))
    };
    let mut extra = record.extra().iter();
    for slot in &record.layout().0 {
        let known = match *slot {
            Slot::Known(index) => usize::from(index),
            Slot::Extra => match extra.next() {
                None => continue,
                Some((key, value)) => match shadowing(key) {
                    Some(index) => index,
                    None => {
                        map.serialize_entry(key, value)?;
                        continue;
                    }
                },
            },
        };
        if !written[known] && record.emit(known, &mut map)? {
            written[known] = true;
        }
    }
    for (index, done) in written.iter().enumerate().take(R::FIELDS.len()) {
        if !done {
            record.emit(index, &mut map)?;
        }
    }
    for (key, value) in extra {
        if shadowing(key).is_none() {
            map.serialize_entry(key, value)?;
        }
    }
    map.end()
}

/// Takes a string out of `value`, or gives `value` back.
pub(crate) fn string(value: Value) -> Result<String, Value> {
    match value {
        Value::String(s) => Ok(s),
        other => Err(other),
    }
}

/// Takes an object out of `value`, or gives `value` back.
pub(crate) fn object(value: Value) -> Result<Map<String, Value>, Value> {
    match value {
        Value::Object(m) => Ok(m),
        other => Err(other),
    }
}

/// Writes `key: value` when `value` is set.
pub(crate) fn emit_opt<M: SerializeMap, T: serde::Serialize>(
    map: &mut M,
    key: &str,
    value: Option<&T>,
) -> Result<bool, M::Error> {
    match value {
        Some(v) => {
            map.serialize_entry(key, v)?;
            Ok(true)
        }
        None => Ok(false),
    }
}
