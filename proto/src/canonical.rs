//! Canonical JSON: the exact bytes a signature covers.
//!
//! Objects are written with their keys sorted by code point, no whitespace
//! anywhere, strings and numbers as serde_json writes them (the same bytes as
//! Python's `json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`
//! for the values gearshift sends). Sorting is done here, not left to the map
//! type, so that the result does not depend on serde_json's `preserve_order` feature.

use serde_json::Value;

/// Appends the canonical form of `v` to `out`.
pub fn write(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => out.extend_from_slice(n.to_string().as_bytes()),
        Value::String(s) => write_str(s, out),
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(x, out);
            }
            out.push(b']');
        }
        Value::Object(m) => write_object(m, out),
    }
}

/// Appends the canonical form of a JSON object to `out`.
pub fn write_object(m: &serde_json::Map<String, Value>, out: &mut Vec<u8>) {
    let mut entries: Vec<(&String, &Value)> = m.iter().collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out.push(b'{');
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(k, out);
        out.push(b':');
        write(v, out);
    }
    out.push(b'}');
}

fn write_str(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\u{08}' => out.extend_from_slice(b"\\b"),
            '\u{0c}' => out.extend_from_slice(b"\\f"),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes());
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// The canonical form of `v` as a new buffer.
pub fn to_vec(v: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write(v, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sorts_keys_and_drops_whitespace() {
        let v = json!({"b": 1, "a": {"d": [1, 2.5, "x"], "c": null}, "é": true});
        assert_eq!(
            String::from_utf8(to_vec(&v)).unwrap(),
            r#"{"a":{"c":null,"d":[1,2.5,"x"]},"b":1,"é":true}"#
        );
    }

    #[test]
    fn escapes_like_python_json_dumps() {
        let v = json!("q\"b\\n\n\u{1}\t/");
        assert_eq!(
            String::from_utf8(to_vec(&v)).unwrap(),
            "\"q\\\"b\\\\n\\n\\u0001\\t/\""
        );
    }

    #[test]
    fn round_trips_through_serde_json() {
        let v = json!({"z": [true, false, {"y": -3, "x": 1e-3}], "k": "v"});
        let back: Value = serde_json::from_slice(&to_vec(&v)).unwrap();
        assert_eq!(back, v);
    }
}
