//! Fuzz target: `repair` and `SchemaGuide` on arbitrary input must never panic, and whatever
//! `repair` returns must serialise to valid JSON.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use selfheal_repair::{SchemaGuide, repair};
use serde_json::json;

static GUIDE: LazyLock<Option<SchemaGuide>> = LazyLock::new(|| {
    SchemaGuide::new(&json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "n": {"type": "integer", "default": 1},
            "tags": {"type": "array", "items": {"type": "str"}},
            "unit": {"enum": ["c", "f"]},
            "nested": {"$ref": "#"},
            "opt": {"anyOf": [{"type": "number"}, {"type": "null"}]}
        },
        "additionalProperties": false
    }))
    .ok()
});

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(repaired) = repair(text) else {
        return;
    };
    let out = serde_json::to_string(&repaired.value).expect("a repaired value serialises");
    // serde_json stops at 128 levels; deeper output is checked by our own parser instead.
    match serde_json::from_str::<serde_json::Value>(&out) {
        Ok(_) => {}
        Err(e) if e.to_string().contains("recursion limit") => {
            let again = repair(&out).expect("deep output parses again");
            assert!(again.repairs.is_empty(), "deep output is valid JSON");
        }
        Err(e) => panic!("the output is not valid JSON: {e}: {out}"),
    }
    if let Some(guide) = GUIDE.as_ref() {
        let _ = guide.apply(repaired.value.clone());
    }
    // The value itself as a schema exercises normalisation and the coercion walk.
    if let Ok(guide) = SchemaGuide::new(&repaired.value) {
        let _ = guide.apply(repaired.value);
    }
});
