//! Reading a field deep in a JSON answer without allocating.
//!
//! `serde_json::Value::pointer` unescapes every token of its path into a new `String`, so a
//! handful of `pointer("/choices/0/message")` calls per request cost the gateway more than
//! checking the tool calls they lead to. [`At`] walks the same literal paths in place. The
//! paths are the code's own constants: no `~0`/`~1` escapes.

use serde_json::Value;

/// `at("/a/0/b")`: the value at a literal JSON Pointer path (object keys and array indices),
/// like `Value::pointer` for paths without escapes.
pub trait At {
    /// The value at `path`, if there is one.
    fn at(&self, path: &str) -> Option<&Value>;
    /// The value at `path`, mutably, if there is one.
    fn at_mut(&mut self, path: &str) -> Option<&mut Value>;
}

impl At for Value {
    fn at(&self, path: &str) -> Option<&Value> {
        let mut v = self;
        for token in tokens(path)? {
            v = match v {
                Value::Object(map) => map.get(token)?,
                Value::Array(items) => items.get(index(token)?)?,
                _ => return None,
            };
        }
        Some(v)
    }

    fn at_mut(&mut self, path: &str) -> Option<&mut Value> {
        let mut v = self;
        for token in tokens(path)? {
            v = match v {
                Value::Object(map) => map.get_mut(token)?,
                Value::Array(items) => items.get_mut(index(token)?)?,
                _ => return None,
            };
        }
        Some(v)
    }
}

/// The tokens of a path; `None` unless it is empty or starts with `/`, as for `pointer`.
fn tokens(path: &str) -> Option<std::iter::Skip<std::str::Split<'_, char>>> {
    (path.is_empty() || path.starts_with('/')).then(|| path.split('/').skip(1))
}

/// An array index as JSON Pointer writes it: digits, no leading zero (but `0` itself).
fn index(token: &str) -> Option<usize> {
    if token.is_empty()
        || (token.len() > 1 && token.starts_with('0'))
        || !token.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    token.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `at` agrees with `Value::pointer` on every path without escapes, present or not.
    #[test]
    fn at_reads_what_pointer_reads() {
        let mut v = json!({"choices": [{"message": {"tool_calls": [{"id": "a"}]},
                                        "finish_reason": "stop"}],
                           "": {"x": 1}, "10": [0, 1], "usage": null});
        for path in [
            "",
            "/choices",
            "/choices/0",
            "/choices/00",
            "/choices/1",
            "/choices/-",
            "/choices/0/message/tool_calls/0/id",
            "/choices/0/finish_reason/x",
            "/",
            "//x",
            "/10/1",
            "/usage",
            "/usage/total_tokens",
            "choices",
        ] {
            assert_eq!(v.at(path), v.pointer(path), "{path}");
            let expected = v.clone().pointer_mut(path).map(|x| x.clone());
            assert_eq!(v.at_mut(path).map(|x| x.clone()), expected, "{path}");
        }
        if let Some(f) = v.at_mut("/choices/0/finish_reason") {
            *f = json!("tool_calls");
        }
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    }
}
