//! From the node's validated fleet settings to the clients' configurations.
//!
//! The one thing not validated with the other settings is the bucket's secret key, which is in
//! a file (`COMBD_FLEET_SECRET_KEY_FILE`): [`parse_secret_key`] checks its text, and
//! [`read_secret_key`] is the one-line read around it, at start-up.

use std::path::Path;

use combd_kernel::settings::{ConfigError, FleetSettings};

use crate::bucket::BucketConfig;
use crate::key_file::read_key_file;

/// The secret key in a key file's text: its first line, trimmed; it must be printable ASCII
/// without spaces, and the only line.
pub fn parse_secret_key(text: &str) -> Result<String, String> {
    one_line(text, "the bucket's secret key")
}

/// The one line of a secret file's text (`what` it must hold), trimmed: printable ASCII
/// without spaces, and the only line.
fn one_line(text: &str, what: &str) -> Result<String, String> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let key = lines
        .next()
        .ok_or_else(|| format!("is empty: it must hold {what} on one line"))?;
    if lines.next().is_some() {
        return Err(format!("holds more than one line: only {what}"));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{what} must be printable ASCII without spaces"));
    }
    Ok(key.to_string())
}

/// Reads the etcd user's password from `path` (`COMBD_FLEET_ETCD_PASSWORD_FILE`), one line as
/// the bucket's secret key.
pub fn read_etcd_password(path: &Path) -> Result<String, ConfigError> {
    read_key_file("COMBD_FLEET_ETCD_PASSWORD_FILE", path, |t| {
        one_line(t, "the etcd user's password")
    })
}

/// Reads the secret key from `path`; the error names `COMBD_FLEET_SECRET_KEY_FILE` and the
/// file, never the key.
pub fn read_secret_key(path: &Path) -> Result<String, ConfigError> {
    read_secret_key_of("COMBD_FLEET_SECRET_KEY_FILE", path)
}

/// Reads a bucket's secret key from `path`, which `setting` names (the error names both, never
/// the key).
pub fn read_secret_key_of(setting: &str, path: &Path) -> Result<String, ConfigError> {
    read_key_file(setting, path, parse_secret_key)
}

/// The bucket client's configuration from the settings and the secret key.
pub fn bucket_config(settings: &FleetSettings, secret_key: String) -> BucketConfig {
    BucketConfig {
        endpoint: settings.bucket_url.clone(),
        bucket: settings.bucket.clone(),
        region: settings.bucket_region.clone(),
        access_key: settings.access_key.clone(),
        secret_key,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_holds_one_key_on_one_line() {
        assert_eq!(parse_secret_key("abc123\n").unwrap(), "abc123");
        assert_eq!(parse_secret_key("\n  abc123  \n\n").unwrap(), "abc123");
        assert!(parse_secret_key("").unwrap_err().contains("empty"));
        assert!(parse_secret_key(" \n").unwrap_err().contains("empty"));
        assert!(parse_secret_key("a\nb\n")
            .unwrap_err()
            .contains("more than one line"));
        assert!(parse_secret_key("a b").unwrap_err().contains("printable"));
        assert!(parse_secret_key("").unwrap_err().contains("secret key"));
    }

    #[test]
    fn a_missing_key_file_names_the_setting_and_the_file_not_a_key() {
        let e = read_secret_key(Path::new("/nonexistent/combd-secret")).unwrap_err();
        assert_eq!(e.setting, "COMBD_FLEET_SECRET_KEY_FILE");
        assert!(e.message.starts_with("/nonexistent/combd-secret: "), "{e}");
    }
}
