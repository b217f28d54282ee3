//! How a SQLite store keeps a message's JSON: deflated when that saves
//! room (a BLOB), else as it is (TEXT). Archived text is mostly tool output
//! and code, which deflate shrinks about three times, so the file stays
//! close to the size of the text it holds. The column's type says which:
//! a TEXT value is the JSON itself (what schema 1 wrote), a BLOB is raw
//! DEFLATE of it.

use std::io::{Read, Write};

use flate2::Compression;
use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use rusqlite::types::{ToSqlOutput, Value, ValueRef};

/// Shorter JSON is kept as it is: deflate would barely save anything.
const PACK_MIN_BYTES: usize = 200;

/// A message's JSON as stored.
#[derive(Debug)]
pub(super) enum Packed<'a> {
    /// The JSON, as it is.
    Text(&'a str),
    /// Raw DEFLATE of the JSON.
    Deflated(Vec<u8>),
}

/// `json` as the store keeps it.
pub(super) fn pack(json: &str) -> Packed<'_> {
    if json.len() < PACK_MIN_BYTES {
        return Packed::Text(json);
    }
    let mut encoder = DeflateEncoder::new(Vec::with_capacity(json.len() / 2), Compression::fast());
    match encoder
        .write_all(json.as_bytes())
        .and_then(|()| encoder.finish())
    {
        Ok(bytes) if bytes.len() < json.len() => Packed::Deflated(bytes),
        _ => Packed::Text(json),
    }
}

impl rusqlite::ToSql for Packed<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Packed::Text(t) => ToSqlOutput::Borrowed(ValueRef::Text(t.as_bytes())),
            Packed::Deflated(b) => ToSqlOutput::Borrowed(ValueRef::Blob(b)),
        })
    }
}

/// The JSON a stored value holds; `Err` says what is wrong with it.
pub(super) fn unpack(value: Value) -> Result<String, String> {
    match value {
        Value::Text(t) => Ok(t),
        Value::Blob(b) => {
            let mut json = String::with_capacity(b.len() * 3);
            DeflateDecoder::new(b.as_slice())
                .read_to_string(&mut json)
                .map_err(|e| format!("cannot inflate the stored message: {e}"))?;
            Ok(json)
        }
        other => Err(format!(
            "a message stored as {:?}, not JSON",
            other.data_type()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_json_is_deflated_and_comes_back_exactly() {
        let json = format!(
            r#"{{"role":"tool","content":"{}"}}"#,
            "line of output\\n".repeat(200)
        );
        let Packed::Deflated(bytes) = pack(&json) else {
            panic!("not deflated")
        };
        assert!(bytes.len() * 4 < json.len());
        assert_eq!(unpack(Value::Blob(bytes)).unwrap(), json);
        assert!(matches!(pack("{}"), Packed::Text("{}")));
        assert_eq!(unpack(Value::Text("{}".into())).unwrap(), "{}");
        assert!(unpack(Value::Blob(vec![0xff; 8])).is_err());
        assert!(unpack(Value::Integer(3)).is_err());
    }
}
