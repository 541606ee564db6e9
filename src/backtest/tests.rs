use super::*;

#[test]
fn durations_parse_with_units() {
    assert_eq!(parse_duration_seconds("1d"), Some(86_400.0));
    assert_eq!(parse_duration_seconds("6h"), Some(21_600.0));
    assert_eq!(parse_duration_seconds("30m"), Some(1_800.0));
    assert_eq!(parse_duration_seconds("90"), Some(90.0));
    assert_eq!(parse_duration_seconds("2.5s"), Some(2.5));
    assert_eq!(parse_duration_seconds("-1"), None);
    assert_eq!(parse_duration_seconds("1w"), None);
    assert_eq!(parse_duration_seconds(""), None);
}
