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

/// Formatted numbers that repeat from event to event: a learned weight
/// is one number per reviewer and table, `table_until` one per epoch, and
/// formatting them again in every event was a third of what `learned`
/// mode's events add (contract §14). A direct-mapped cache per thread, keyed
/// by the value's bits (a slot holds the last value that mapped to it).
/// Hand-written: no crate caches formatted numbers, and this is a few
/// dozen lines.
struct Memo {
    slots: Box<[(u128, u8, [u8; SLOT_BYTES])]>,
}

/// The longest number written here: an f64 (`-2.2250738585072014e-308`,
/// 24 bytes) or a quoted timestamp (32 bytes).
const SLOT_BYTES: usize = 32;

/// 2^11 slots of 64 bytes: 128 KiB per cache and thread.
const MEMO_BITS: u32 = 11;

impl Memo {
    fn new() -> Memo {
        Memo {
            slots: vec![(0, 0, [0; SLOT_BYTES]); 1 << MEMO_BITS].into_boxed_slice(),
        }
    }

    /// Fibonacci hashing of both halves: the top bits of the product.
    fn slot(key: u128) -> usize {
        let folded = (key as u64) ^ ((key >> 64) as u64).rotate_left(32);
        (folded.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - MEMO_BITS)) as usize
    }

    /// Appends the bytes `write` writes for the value with bits `key` (of
    /// one kind: floats and timestamps have a cache each), from the cache
    /// when its slot holds them.
    fn write(&mut self, out: &mut Vec<u8>, key: u128, write: impl FnOnce(&mut Vec<u8>)) {
        let slot = &mut self.slots[Memo::slot(key)];
        if slot.1 != 0 && slot.0 == key {
            out.extend_from_slice(&slot.2[..usize::from(slot.1)]);
            return;
        }
        let start = out.len();
        write(out);
        let bytes = &out[start..];
        if bytes.len() <= SLOT_BYTES {
            slot.0 = key;
            slot.1 = bytes.len() as u8;
            slot.2[..bytes.len()].copy_from_slice(bytes);
        }
    }
}

thread_local! {
    static FLOATS: std::cell::RefCell<Memo> = std::cell::RefCell::new(Memo::new());
    static TIMES: std::cell::RefCell<Memo> = std::cell::RefCell::new(Memo::new());
}

fn timestamp(out: &mut Vec<u8>, t: Nanos) {
    let (buf, n) = timestamp_bytes(t);
    out.push(b'"');
    out.extend_from_slice(&buf[..n]);
    out.push(b'"');
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
        timestamp(self.out, t);
        self
    }

    /// [`Json::ts`] of a timestamp that repeats from event to event.
    pub fn ts_repeated(&mut self, key: &str, t: Nanos) -> &mut Self {
        self.key(key);
        TIMES.with_borrow_mut(|m| m.write(self.out, t as u128, |out| timestamp(out, t)));
        self
    }

    /// [`Json::f64`] of a number that repeats from event to event.
    pub fn f64_repeated(&mut self, key: &str, v: f64) -> &mut Self {
        self.key(key);
        FLOATS.with_borrow_mut(|m| m.write(self.out, v.to_bits().into(), |out| float(out, v)));
        self
    }

    /// An array of numbers that repeat from event to event.
    pub fn f64s_repeated(&mut self, key: &str, vs: &[f64]) -> &mut Self {
        self.key(key);
        self.out.push(b'[');
        FLOATS.with_borrow_mut(|m| {
            for (i, &v) in vs.iter().enumerate() {
                if i > 0 {
                    self.out.push(b',');
                }
                m.write(self.out, v.to_bits().into(), |out| float(out, v));
            }
        });
        self.out.push(b']');
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

    /// A slot gives back only the value it was last given: keys that share
    /// it (the same low or the same high 64 bits) are written afresh.
    #[test]
    fn a_memo_slot_answers_only_for_its_own_key() {
        let a: u128 = 12_345;
        let same = |k: &u128| Memo::slot(*k) == Memo::slot(a);
        let high = (1u128..).map(|h| a + (h << 64)).find(same).unwrap();
        let low = (a + 1..).find(same).unwrap();
        let mut memo = Memo::new();
        let mut out = Vec::new();
        for (key, text) in [
            (a, "a"),
            (high, "high"),
            (a, "a"),
            (low, "low"),
            (low, "low"),
            (high, "high"),
        ] {
            let start = out.len();
            memo.write(&mut out, key, |o| o.extend_from_slice(text.as_bytes()));
            assert_eq!(&out[start..], text.as_bytes());
        }
    }

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
        // The caches of repeated numbers write the same bytes, for values
        // that share a slot (more values than slots) and come back.
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut values: Vec<f64> = floats.to_vec();
        values.extend((0..3 << MEMO_BITS).map(|_| f64::from_bits(next())));
        values.extend((0..3 << MEMO_BITS).map(|i| f64::from(i % 97) / 89.0));
        for round in 0..2 {
            let mut out = Vec::new();
            let mut o = Json::object(&mut out);
            o.f64s_repeated("a", &values);
            for &v in &values {
                o.f64_repeated("f", v);
            }
            o.close();
            let mut expected = Vec::new();
            let mut o = Json::object(&mut expected);
            let mut a = o.open_array("a");
            for &v in &values {
                a.f64("", v);
            }
            a.close();
            for &v in &values {
                o.f64("f", v);
            }
            o.close();
            assert!(out == expected, "floats, round {round}");
        }
        let times: Vec<Nanos> = (0..3 << MEMO_BITS)
            .map(|i| match i % 3 {
                0 => Nanos::from(next() as i64),
                // Apart by 2^64 ns: the same low bits.
                1 => Nanos::from(i % 89) * 3_600_000_000_000 + (Nanos::from(i % 2) << 64),
                _ => Nanos::from(i) * 1_234_567,
            })
            .chain([Nanos::MIN, Nanos::MAX, 0, -1])
            .collect();
        for _ in 0..2 {
            let (mut out, mut expected) = (Vec::new(), Vec::new());
            let (mut o, mut e) = (Json::object(&mut out), Json::object(&mut expected));
            for &t in &times {
                o.ts_repeated("t", t);
                e.ts("t", t);
            }
            o.close();
            e.close();
            assert!(out == expected, "timestamps");
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
