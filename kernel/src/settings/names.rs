//! Unknown names: a `COMBD_*` variable or a flag that is not a setting is refused, naming the
//! closest one (a typo must not be silently ignored).

use super::*;

/// Edit distance (Levenshtein) between two ASCII-case-folded strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<u8> = a.bytes().map(|c| c.to_ascii_uppercase()).collect();
    let b: Vec<u8> = b.bytes().map(|c| c.to_ascii_uppercase()).collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = prev[j] + usize::from(ca != cb);
            cur[j + 1] = substitute.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The candidate closest to `name` by edit distance (ignoring case), if it is close enough to
/// be a typo of it: at most a third of the candidate's length apart, and at least one edit is
/// always allowed. Ties go to the first candidate.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, c)| *d <= (c.len() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Refuses an environment variable named like a setting (`COMBD_*`) that is not one, naming
/// the closest setting: a typo (`COMBD_MAX_AWAK=5`) would otherwise be ignored silently and
/// the default used. `names` are the environment's variable names; the first unknown one in
/// sorted order is reported.
pub fn check_env_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), ConfigError> {
    let mut unknown: Vec<&str> = names
        .into_iter()
        .filter(|n| n.starts_with("COMBD_") && !SETTINGS.iter().any(|s| s.env == *n))
        .collect();
    unknown.sort_unstable();
    match unknown.first() {
        None => Ok(()),
        Some(name) => {
            let hint = match closest(name, SETTINGS.iter().map(|s| s.env)) {
                Some(known) => format!("did you mean {known}?"),
                None => "see combd --help for the settings".to_string(),
            };
            Err(err(name, format!("is not a setting; {hint}")))
        }
    }
}
