//! The events' JSON writer. Hand-written because serde_json escapes every
//! string, each key included, one byte at a time: that was over a quarter
//! of replay's encoder thread. Here keys are copied as they are (they are
//! constants), a string with nothing to escape (every id in practice) is
//! copied whole, and everything else, every number and every string that
//! needs escaping, is written by serde_json itself, so the bytes are
//! serde_json's.

use serde_json::ser::{CompactFormatter, Formatter};

use crate::time::{timestamp_bytes, Nanos};

/// Writes `s` as a JSON string.
fn string(out: &mut Vec<u8>, s: &str) {
    // No early exit, so that the check runs over whole vectors.
    let plain = s
        .bytes()
        .fold(true, |ok, b| ok & (b >= 0x20) & (b != b'"') & (b != b'\\'));
    if plain {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

fn float(out: &mut Vec<u8>, v: f64) {
    // As serde_json serializes an f64: non-finite is null.
    if v.is_finite() {
        let _ = CompactFormatter.write_f64(out, v);
    } else {
        out.extend_from_slice(b"null");
    }
}

/// An object (or, with [`Json::array`], an array) being written: the
/// opening bracket is written when it is opened, the closing one by
/// [`Json::close`].
pub(super) struct Json<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
    end: u8,
}

impl<'a> Json<'a> {
    pub fn object(out: &'a mut Vec<u8>) -> Json<'a> {
        out.push(b'{');
        Json {
            out,
            first: true,
            end: b'}',
        }
    }

    fn array(out: &'a mut Vec<u8>) -> Json<'a> {
        out.push(b'[');
        Json {
            out,
            first: true,
            end: b']',
        }
    }

    pub fn close(&mut self) {
        self.out.push(self.end);
    }

    /// The separator, and the key (a constant with nothing to escape) in
    /// an object.
    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        if self.end == b'}' {
            debug_assert!(!key.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\'));
            self.out.push(b'"');
            self.out.extend_from_slice(key.as_bytes());
            self.out.extend_from_slice(b"\":");
        }
    }

    pub fn str(&mut self, key: &str, v: &str) -> &mut Self {
        self.key(key);
        string(self.out, v);
        self
    }

    pub fn opt_str(&mut self, key: &str, v: Option<&str>) -> &mut Self {
        match v {
            Some(v) => self.str(key, v),
            None => self.null(key),
        }
    }

    pub fn null(&mut self, key: &str) -> &mut Self {
        self.key(key);
        self.out.extend_from_slice(b"null");
        self
    }

    pub fn f64(&mut self, key: &str, v: f64) -> &mut Self {
        self.key(key);
        float(self.out, v);
        self
    }

    pub fn opt_f64(&mut self, key: &str, v: Option<f64>) -> &mut Self {
        match v {
            Some(v) => self.f64(key, v),
            None => self.null(key),
        }
    }

    pub fn u64(&mut self, key: &str, v: u64) -> &mut Self {
        self.key(key);
        let _ = CompactFormatter.write_u64(self.out, v);
        self
    }

    pub fn i64(&mut self, key: &str, v: i64) -> &mut Self {
        self.key(key);
        let _ = CompactFormatter.write_i64(self.out, v);
        self
    }

    pub fn bool(&mut self, key: &str, v: bool) -> &mut Self {
        self.key(key);
        self.out
            .extend_from_slice(if v { b"true" as &[u8] } else { b"false" });
        self
    }

    /// A timestamp as [`crate::time::format_timestamp`] writes it.
    pub fn ts(&mut self, key: &str, t: Nanos) -> &mut Self {
        self.key(key);
        let (buf, n) = timestamp_bytes(t);
        self.out.push(b'"');
        self.out.extend_from_slice(&buf[..n]);
        self.out.push(b'"');
        self
    }

    pub fn opt_ts(&mut self, key: &str, t: Option<Nanos>) -> &mut Self {
        match t {
            Some(t) => self.ts(key, t),
            None => self.null(key),
        }
    }

    /// A nested object, written until it is closed.
    pub fn open_object(&mut self, key: &str) -> Json<'_> {
        self.key(key);
        Json::object(self.out)
    }

    /// A nested array, written until it is closed; its elements take no
    /// key (pass "").
    pub fn open_array(&mut self, key: &str) -> Json<'_> {
        self.key(key);
        Json::array(self.out)
    }

    /// An object element of an array.
    pub fn element_object(&mut self) -> Json<'_> {
        self.key("");
        Json::object(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every string and number writes the bytes serde_json writes.
    #[test]
    fn strings_and_numbers_are_written_as_serde_json_writes_them() {
        let strings = [
            "",
            "inf-0000001",
            "quote \" and \\ backslash",
            "tab\tnew\nline\r\u{1}\u{1f}\u{7f}",
            "ünïcødé ✓ 🎉",
            "</script>",
        ];
        for s in strings {
            let mut out = Vec::new();
            Json::object(&mut out).str("k", s).close();
            let expected = serde_json::json!({ "k": s }).to_string();
            assert_eq!(String::from_utf8(out).unwrap(), expected, "{s:?}");
        }
        let floats = [
            0.0,
            -0.0,
            1.0,
            0.1 + 0.2,
            1e-300,
            2.3195228302435696e-16,
            1e21,
            f64::MAX,
            f64::MIN_POSITIVE,
            f64::NAN,
            f64::INFINITY,
        ];
        for v in floats {
            let mut out = Vec::new();
            Json::object(&mut out).f64("k", v).close();
            let expected = serde_json::to_string(&serde_json::json!({ "k": v })).unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), expected, "{v:?}");
        }
        let mut out = Vec::new();
        let mut o = Json::object(&mut out);
        o.u64("a", u64::MAX)
            .i64("b", i64::MIN)
            .bool("c", true)
            .null("d");
        let mut a = o.open_array("e");
        a.str("", "x");
        let mut n = a.element_object();
        n.u64("n", 1);
        n.close();
        a.close();
        o.opt_str("f", None);
        o.close();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":18446744073709551615,"b":-9223372036854775808,"c":true,"d":null,"e":["x",{"n":1}],"f":null}"#
        );
    }
}
