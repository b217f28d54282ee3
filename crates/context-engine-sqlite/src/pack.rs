//! How a SQLite store keeps a message's JSON: deflated when that saves
//! room (a BLOB), else as it is (TEXT). Archived text is mostly tool output
//! and code, which deflate shrinks about three times, so the file stays
//! close to the size of the text it holds. The column's type says which:
//! a TEXT value is the JSON itself (what schema 1 wrote), a BLOB is raw
//! DEFLATE of it.

use std::cell::RefCell;
use std::io::Read;

use flate2::read::DeflateDecoder;
use flate2::{Compress, Compression, FlushCompress, Status};
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

thread_local! {
    /// One compressor per thread, reset for each message: building one
    /// allocates and clears its tables (hundreds of KB), which cost more
    /// than deflating a typical message.
    static DEFLATE: RefCell<Compress> = RefCell::new(Compress::new(Compression::fast(), false));
}

/// `json` as the store keeps it.
pub(super) fn pack(json: &str) -> Packed<'_> {
    if json.len() < PACK_MIN_BYTES {
        return Packed::Text(json);
    }
    let deflated = DEFLATE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut compress) => {
            compress.reset();
            deflate(&mut compress, json.as_bytes())
        }
        Err(_) => deflate(
            &mut Compress::new(Compression::fast(), false),
            json.as_bytes(),
        ),
    });
    match deflated {
        Some(bytes) => Packed::Deflated(bytes),
        None => Packed::Text(json),
    }
}

/// Raw DEFLATE of `input` with a fresh (or freshly reset) `compress`;
/// `None` when it would not be shorter than `input`.
fn deflate(compress: &mut Compress, input: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(input.len() / 2 + 64);
    loop {
        let read = usize::try_from(compress.total_in()).ok()?;
        match compress.compress_vec(input.get(read..)?, &mut out, FlushCompress::Finish) {
            Ok(Status::StreamEnd) => return (out.len() < input.len()).then_some(out),
            Ok(_) if out.len() < input.len() => out.reserve(input.len() / 4 + 64),
            _ => return None,
        }
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

/// Why a stored value holds no message JSON.
#[derive(Debug, thiserror::Error)]
pub(super) enum UnpackError {
    /// A BLOB that is not raw DEFLATE of UTF-8 text.
    #[error("cannot inflate the stored message: {0}")]
    Inflate(std::io::Error),
    /// A value of another SQLite type.
    #[error("a message stored as {0:?}, not JSON")]
    NotJson(rusqlite::types::Type),
}

/// The JSON a stored value holds; `Err` says what is wrong with it.
pub(super) fn unpack(value: Value) -> Result<String, UnpackError> {
    match value {
        Value::Text(t) => Ok(t),
        Value::Blob(b) => {
            let mut json = String::with_capacity(b.len() * 3);
            DeflateDecoder::new(b.as_slice())
                .read_to_string(&mut json)
                .map_err(UnpackError::Inflate)?;
            Ok(json)
        }
        other => Err(UnpackError::NotJson(other.data_type())),
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

    #[test]
    fn the_reused_compressor_starts_afresh_for_each_message() {
        let texts: Vec<String> = (0..5)
            .map(|i| {
                format!(
                    r#"{{"role":"tool","content":"{}"}}"#,
                    format!("out {i}\\n").repeat(100 + i)
                )
            })
            .collect();
        for json in &texts {
            let Packed::Deflated(bytes) = pack(json) else {
                panic!("not deflated")
            };
            assert_eq!(&unpack(Value::Blob(bytes)).unwrap(), json);
        }
    }
}
