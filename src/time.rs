//! Event time: instants as integer nanoseconds since the Unix epoch (UTC).
//!
//! `i128` nanoseconds keep every instant of years 0000..=9999 exact, so
//! window arithmetic (`floor(ts / W) * W`) never rounds.

/// An instant, in nanoseconds since 1970-01-01T00:00:00Z.
pub type Nanos = i128;

pub const NANOS_PER_SEC: i128 = 1_000_000_000;

/// Why a time string was refused (the text goes into `detail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeError {
    Syntax,
    MonthOutOfRange,
    DayOutOfRange,
    HourOutOfRange,
    MinuteOutOfRange,
    SecondOutOfRange,
    OffsetOutOfRange,
}

impl TimeError {
    pub fn message(self) -> &'static str {
        match self {
            TimeError::Syntax => "not an RFC 3339 / ISO 8601 date-time",
            TimeError::MonthOutOfRange => "month out of range",
            TimeError::DayOutOfRange => "day out of range",
            TimeError::HourOutOfRange => "hour out of range",
            TimeError::MinuteOutOfRange => "minute out of range",
            TimeError::SecondOutOfRange => "second out of range",
            TimeError::OffsetOutOfRange => "UTC offset out of range",
        }
    }
}

fn digits(b: &[u8], at: usize, n: usize) -> Option<u32> {
    let s = b.get(at..at + n)?;
    let mut v = 0u32;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u32::from(c - b'0');
    }
    Some(v)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ => {
            if is_leap(y) {
                29
            } else {
                28
            }
        }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day number (inverse of [`days_from_civil`]).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parses `YYYY-MM-DDThh:mm:ss[.f{1,9}](Z|±hh:mm)?`; no suffix means UTC.
/// `T` and `Z` may be lower case. Leap seconds and other spellings are refused.
pub fn parse_timestamp(s: &str) -> Result<Nanos, TimeError> {
    let b = s.as_bytes();
    if b.len() < 19 {
        return Err(TimeError::Syntax);
    }
    let year = digits(b, 0, 4).ok_or(TimeError::Syntax)?;
    let month = digits(b, 5, 2).ok_or(TimeError::Syntax)?;
    let day = digits(b, 8, 2).ok_or(TimeError::Syntax)?;
    let hour = digits(b, 11, 2).ok_or(TimeError::Syntax)?;
    let minute = digits(b, 14, 2).ok_or(TimeError::Syntax)?;
    let second = digits(b, 17, 2).ok_or(TimeError::Syntax)?;
    if b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(TimeError::Syntax);
    }
    let mut i = 19;
    let mut frac: i128 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let n = i - start;
        if n == 0 || n > 9 {
            return Err(TimeError::Syntax);
        }
        let mut v: i128 = 0;
        for &c in &b[start..i] {
            v = v * 10 + i128::from(c - b'0');
        }
        frac = v * 10i128.pow((9 - n) as u32);
    }
    let offset_secs: i64 = match b.get(i) {
        None => 0,
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(&sign @ (b'+' | b'-')) if i + 6 == b.len() => {
            let oh = digits(b, i + 1, 2).ok_or(TimeError::Syntax)?;
            let om = digits(b, i + 4, 2).ok_or(TimeError::Syntax)?;
            if b[i + 3] != b':' {
                return Err(TimeError::Syntax);
            }
            if oh > 23 || om > 59 {
                return Err(TimeError::OffsetOutOfRange);
            }
            let o = i64::from(oh * 3600 + om * 60);
            if sign == b'-' {
                -o
            } else {
                o
            }
        }
        _ => return Err(TimeError::Syntax),
    };
    if !(1..=12).contains(&month) {
        return Err(TimeError::MonthOutOfRange);
    }
    let year = i64::from(year);
    if day == 0 || day > days_in_month(year, month) {
        return Err(TimeError::DayOutOfRange);
    }
    if hour > 23 {
        return Err(TimeError::HourOutOfRange);
    }
    if minute > 59 {
        return Err(TimeError::MinuteOutOfRange);
    }
    if second > 59 {
        return Err(TimeError::SecondOutOfRange);
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second) - offset_secs;
    Ok(i128::from(secs) * NANOS_PER_SEC + frac)
}

/// `a.div_euclid(b)`, in i64 when both fit and `b` > 0: i128 division is
/// a library call (`__divti3`), several times dearer, and windows and
/// epochs divide every vote's time.
pub fn div_euclid(a: Nanos, b: Nanos) -> Nanos {
    match (i64::try_from(a), i64::try_from(b)) {
        (Ok(a), Ok(b)) if b > 0 => a.div_euclid(b).into(),
        _ => a.div_euclid(b),
    }
}

/// RFC 3339 in UTC with `Z`, exact to the nanosecond; the fraction is
/// printed only as far as it is non-zero.
pub fn format_timestamp(t: Nanos) -> String {
    let mut out = String::with_capacity(30);
    write_timestamp(&mut out, t);
    out
}

/// Appends [`format_timestamp`] of `t` to `out`.
pub fn write_timestamp(out: &mut String, t: Nanos) {
    let (buf, n) = timestamp_bytes(t);
    out.push_str(std::str::from_utf8(&buf[..n]).unwrap_or("invalid"));
}

/// [`format_timestamp`] of `t` in a buffer on the stack: its first `n`
/// bytes (ASCII).
pub fn timestamp_bytes(t: Nanos) -> ([u8; 40], usize) {
    // In i64 (`div_euclid`): this runs for every timestamp of every event.
    // Wrapping, because the true remainders (0..1e9, 0..86 400) are right
    // even where the product is not an i128.
    let secs = div_euclid(t, NANOS_PER_SEC);
    let nanos = t.wrapping_sub(secs.wrapping_mul(NANOS_PER_SEC)) as u32;
    let days = div_euclid(secs, 86_400);
    let sod = secs.wrapping_sub(days.wrapping_mul(86_400)) as u32;
    let days = days as i64;
    let (y, m, d) = civil_from_days(days);
    let y4 = y.clamp(0, 9999) as u32;
    // "YYYY-MM-DDThh:mm:ss" at fixed places (no bounds checks), then the
    // fraction, as far as it is non-zero, and "Z".
    let mut buf = [0u8; 40];
    buf[..19].copy_from_slice(b"0000-00-00T00:00:00");
    let mut two = |at: usize, v: u32| {
        buf[at] = b'0' + (v / 10) as u8;
        buf[at + 1] = b'0' + (v % 10) as u8;
    };
    two(0, y4 / 100);
    two(2, y4 % 100);
    two(5, m);
    two(8, d);
    two(11, sod / 3600);
    two(14, sod / 60 % 60);
    two(17, sod % 60);
    let mut end = 19;
    if nanos != 0 {
        buf[19] = b'.';
        let mut f = nanos;
        for c in buf[20..29].iter_mut().rev() {
            *c = b'0' + (f % 10) as u8;
            f /= 10;
        }
        end = 29;
        while buf[end - 1] == b'0' {
            end -= 1;
        }
    }
    buf[end] = b'Z';
    (buf, end + 1)
}

/// The wall clock as nanoseconds since the epoch: the one clock read of
/// the shells (`processed_at`, the future-skew check, the idle flush).
/// Nothing in the engine calls it.
pub fn wall_clock() -> Nanos {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as Nanos)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_spellings_of_the_contract() {
        let z = parse_timestamp("2024-07-07T19:22:30.608761Z").unwrap();
        assert_eq!(parse_timestamp("2024-07-07T19:22:30.608761").unwrap(), z);
        assert_eq!(parse_timestamp("2024-07-07t19:22:30.608761z").unwrap(), z);
        assert_eq!(
            parse_timestamp("2024-07-07T21:22:30.608761+02:00").unwrap(),
            z
        );
        assert_eq!(
            parse_timestamp("2024-07-07T18:52:30.608761-00:30").unwrap(),
            z
        );
        assert_eq!(z % NANOS_PER_SEC, 608_761_000);
        assert_eq!(parse_timestamp("1970-01-01T00:00:00Z").unwrap(), 0);
        assert_eq!(
            parse_timestamp("1970-01-01T00:00:00.000000001Z").unwrap(),
            1
        );
        assert_eq!(
            parse_timestamp("1969-12-31T23:59:59.5Z").unwrap(),
            -500_000_000
        );
    }

    #[test]
    fn refuses_what_is_not_rfc3339() {
        for s in [
            "2024-07-07T10:00:00+05",
            "2024-7-7T10:00:00Z",
            "2024-07-07T10:00:00,5Z",
            "T10:00:00Z",
            "20240707T100000Z",
            "2024-07-07T10:00:00.Z",
            "2024-07-07T10:00:00.1234567890Z",
            "2024-07-07 10:00:00Z",
            "2024-07-07T10:00:00ZZ",
            "",
            "2024-07-07T10:00:60Z",
            "2023-02-29T10:00:00Z",
            "2024-13-01T10:00:00Z",
            "2024-07-07T24:00:00Z",
            "2024-07-07T10:00:00+24:00",
            "２０２４-07-07T10:00:00Z",
        ] {
            assert!(parse_timestamp(s).is_err(), "{s} accepted");
        }
        assert_eq!(
            parse_timestamp("2023-02-29T10:00:00Z"),
            Err(TimeError::DayOutOfRange)
        );
        assert!(parse_timestamp("2024-02-29T10:00:00Z").is_ok());
    }

    #[test]
    fn formats_round_trip() {
        for s in [
            "2024-07-07T00:07:02.438793Z",
            "2024-07-07T00:07:02Z",
            "2024-07-07T00:07:02.000000001Z",
            "1969-12-31T23:59:59.5Z",
            "0001-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999999999Z",
            "2000-02-29T12:00:00.1Z",
            // i64's ends (the fast path) and one past each (i128's).
            "2262-04-11T23:47:16.854775807Z",
            "2262-04-11T23:47:16.854775808Z",
            "1677-09-21T00:12:43.145224192Z",
            "1677-09-21T00:12:43.145224191Z",
        ] {
            let t = parse_timestamp(s).unwrap();
            assert_eq!(format_timestamp(t), s);
        }
        let max = parse_timestamp("2262-04-11T23:47:16.854775807Z").unwrap();
        let min = parse_timestamp("1677-09-21T00:12:43.145224192Z").unwrap();
        assert_eq!((max, min), (i64::MAX.into(), i64::MIN.into()));
        // Any instant, any fraction: parse(format(t)) = t.
        let mut t: Nanos = -3_000_000_000_000_000_000;
        while t < 9_000_000_000_000_000_000 {
            assert_eq!(parse_timestamp(&format_timestamp(t)), Ok(t), "{t}");
            t += 7_777_777_777_777_777 + t.rem_euclid(1_000);
        }
    }

    #[test]
    fn divides_as_i128_does() {
        let big = i128::from(i64::MAX);
        let edges = [big, big + 1, -big - 1, -big - 2, i128::MAX, i128::MIN];
        for a in [0, 1, -1, 59, -61].into_iter().chain(edges) {
            for b in [1, 60, 3_600_000_000_000, big, big + 1] {
                assert_eq!(div_euclid(a, b), a.div_euclid(b), "{a} / {b}");
            }
        }
    }

    #[test]
    fn civil_round_trip_over_many_days() {
        for d in (-800_000..800_000).step_by(997) {
            let (y, m, dd) = civil_from_days(d);
            assert_eq!(days_from_civil(y, m, dd), d);
        }
    }
}
