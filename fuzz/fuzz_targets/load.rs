//! Arbitrary bytes into the transcript loader: it must never panic, and what
//! it accepts must write back to text that loads and writes the same again.
//!
//! Run with `cargo fuzz run load -s none` (stable toolchain).
#![no_main]

use context_engine::transcript::{Format, Transcript};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = Transcript::parse(data, "fuzz") {
        let written = t.to_json_string();
        let back = match Transcript::parse_as(&written, "written", t.format) {
            Ok(back) => back,
            Err(e) => panic!("written {} does not load back: {e}\n{written}", t.format),
        };
        assert_eq!(
            back.to_json_string(),
            written,
            "not stable after a round trip"
        );
        // Every format loads back with the same (normalised) messages.
        let standard = serde_json::to_string(&t.messages).ok();
        for format in Format::ALL {
            if format == Format::JsonLines && t.messages.is_empty() {
                continue; // an empty file is an error, by design
            }
            let converted = t.render(format);
            let again = Transcript::parse_as(&converted, "converted", format);
            assert_eq!(
                again
                    .ok()
                    .and_then(|c| serde_json::to_string(&c.messages).ok()),
                standard,
                "{format}"
            );
        }
    }
    for format in Format::ALL {
        let _ = Transcript::parse_as(data, "fuzz", format);
    }
});
