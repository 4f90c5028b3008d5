//! Reading a key file a setting names (the bucket's secret key, the fleet key, a client
//! certificate's private key): a leaf, so the modules that read one (`config`, `auth`, `tls`)
//! need nothing of each other for it.

use std::path::Path;

use combd_kernel::settings::ConfigError;

/// Reads the key file at `path` that `setting` names and parses its text with `parse`; the
/// error names the setting and the file, never what the file holds.
pub(crate) fn read_key_file<T>(
    setting: &str,
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, ConfigError> {
    let error = |m: String| ConfigError {
        setting: setting.to_string(),
        message: format!("{}: {m}", path.display()),
    };
    let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
    parse(&text).map_err(error)
}
