//! The `Date` of responses: an IMF-fixdate (RFC 9110, 5.6.7), formatted without a calendar
//! library.

/// An IMF-fixdate (RFC 9110, 5.6.7), e.g. `Sun, 06 Nov 1994 08:49:37 GMT`: always 29 bytes.
pub type HttpDate = [u8; 29];

/// The IMF-fixdate of a time in seconds since the Unix epoch.
pub fn http_date(unix_secs: u64) -> HttpDate {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = unix_secs / 86_400;
    let secs = unix_secs % 86_400;
    let (year, month, day) = civil_date(days);
    let text = format!(
        "{}, {day:02} {} {year:04} {:02}:{:02}:{:02} GMT",
        DAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    );
    let mut out = [b' '; 29];
    let n = text.len().min(29);
    out[..n].copy_from_slice(&text.as_bytes()[..n]);
    out
}

/// The civil date (year, month 1–12, day 1–31) of a day counted from 1970-01-01 (Howard
/// Hinnant's `days_from_civil`, inverted).
pub(crate) fn civil_date(days: u64) -> (i64, i64, i64) {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_imf_fixdates() {
        let d = |t| String::from_utf8(http_date(t).to_vec()).unwrap();
        assert_eq!(d(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(d(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(d(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(d(1_795_996_799), "Sun, 29 Nov 2026 23:59:59 GMT");
        assert_eq!(d(4_107_542_400), "Mon, 01 Mar 2100 00:00:00 GMT");
    }
}
