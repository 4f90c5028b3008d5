//! The backup's settings: where it goes (`COMBD_BACKUP`: a directory or an S3 bucket), how
//! long it keeps what it has, and how an `s3://` one reaches its bucket (`COMBD_BACKUP_S3_*`,
//! `COMBD_BACKUP_KEY_FILE`: all or none, and only with an `s3://` target).

use super::*;

/// Where the backup goes (`COMBD_BACKUP`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackupTarget {
    /// A directory on this machine (another disk, ideally).
    Dir(PathBuf),
    /// An S3 bucket (`s3://<bucket>[/<prefix>]`), reached with the `COMBD_BACKUP_S3_*`
    /// settings.
    Bucket {
        /// The bucket's name.
        bucket: String,
        /// What every key begins with: empty, or ending with `/`.
        prefix: String,
    },
}

impl std::fmt::Display for BackupTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackupTarget::Dir(d) => write!(f, "{}", d.display()),
            BackupTarget::Bucket { bucket, prefix } => {
                write!(f, "s3://{bucket}/{}", prefix.trim_end_matches('/'))
            }
        }
    }
}

/// Parses `COMBD_BACKUP`: `off`, `s3://<bucket>[/<prefix>]`, or the backup's directory.
pub(super) fn parse_backup(text: &str) -> Result<Option<BackupTarget>, String> {
    const USE: &str = "use off, a directory or s3://<bucket>/<prefix>";
    match text {
        "off" => Ok(None),
        "" => Err(format!("must not be empty: {USE}")),
        path if path.trim() != path => Err(format!("{path:?} begins or ends with a blank: {USE}")),
        url if url.starts_with("s3://") => parse_backup_bucket(&url[5..]).map(Some),
        path => Ok(Some(BackupTarget::Dir(PathBuf::from(path)))),
    }
}

/// `<bucket>[/<prefix>]` of an `s3://` backup: a bucket's name as S3 has them, and a prefix
/// of at most 256 bytes of `A-Z a-z 0-9 . _ -` in `/`-separated parts, none empty.
fn parse_backup_bucket(text: &str) -> Result<BackupTarget, String> {
    let (bucket, prefix) = text.split_once('/').unwrap_or((text, ""));
    let bucket = parse_bucket_name(bucket)?;
    let prefix = prefix.trim_end_matches('/');
    let part_ok = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    };
    if prefix.len() > 256 || (!prefix.is_empty() && !prefix.split('/').all(part_ok)) {
        return Err(format!(
            "s3://{text}: the prefix after the bucket must be at most 256 bytes of \
             A-Z a-z 0-9 . _ - in parts separated by single slashes"
        ));
    }
    let prefix = match prefix {
        "" => String::new(),
        p => format!("{p}/"),
    };
    Ok(BackupTarget::Bucket { bucket, prefix })
}

/// Parses `COMBD_BACKUP_RETENTION`: a duration of at least
/// [`BACKUP_RETENTION_MIN`](limits::BACKUP_RETENTION_MIN).
pub(super) fn parse_retention(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d < limits::BACKUP_RETENTION_MIN {
        return Err(format!(
            "{text:?} is shorter than a minute (backup_retention_min_ms)"
        ));
    }
    Ok(d)
}

/// How an `s3://` backup reaches its bucket, and the key that seals what it stores there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupBucketSettings {
    /// `COMBD_BACKUP_S3_URL`: the S3 endpoint, `http://host:port` or `https://host:port`.
    pub url: String,
    /// `COMBD_BACKUP_S3_REGION`: the region S3 signatures name.
    pub region: String,
    /// `COMBD_BACKUP_S3_ACCESS_KEY`: the access key id.
    pub access_key: String,
    /// `COMBD_BACKUP_S3_SECRET_KEY_FILE`: the file holding the secret key, read at start-up.
    pub secret_key_file: PathBuf,
    /// `COMBD_BACKUP_KEY_FILE`: the file holding the key that seals every base and log chunk
    /// (read at start-up, at least 32 bytes): what is in the bucket is taken back only as a
    /// node with this key stored it, under the key it stored it at.
    pub key_file: PathBuf,
}

/// The settings of an `s3://` backup that mean something only with `COMBD_BACKUP_S3_URL`.
const WITH_S3_URL: &[&str] = &[
    "COMBD_BACKUP_S3_REGION",
    "COMBD_BACKUP_S3_ACCESS_KEY",
    "COMBD_BACKUP_S3_SECRET_KEY_FILE",
    "COMBD_BACKUP_KEY_FILE",
];

/// The backup bucket's group: `COMBD_BACKUP_S3_URL` turns it on and requires the others but
/// the region; without it none may be set. (That `COMBD_BACKUP` is an `s3://` target exactly
/// when it is on is checked between the settings.)
pub(super) fn backup_bucket_group(
    given: &Given<'_>,
) -> Result<Option<BackupBucketSettings>, ConfigError> {
    let Some(url) = given.get("COMBD_BACKUP_S3_URL") else {
        if let Some(name) = WITH_S3_URL.iter().find(|n| given.get(n).is_some()) {
            return Err(err(name, "is set but COMBD_BACKUP_S3_URL is not"));
        }
        return Ok(None);
    };
    let url = parse_http_endpoint(url).map_err(|m| err("COMBD_BACKUP_S3_URL", m))?;
    let required = |name: &str| {
        given
            .get(name)
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .ok_or_else(|| err(name, "required with COMBD_BACKUP_S3_URL"))
    };
    let access_key = required("COMBD_BACKUP_S3_ACCESS_KEY")?;
    if !access_key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(err(
            "COMBD_BACKUP_S3_ACCESS_KEY",
            "must be printable ASCII without spaces",
        ));
    }
    let region = parse_region(
        given
            .get("COMBD_BACKUP_S3_REGION")
            .unwrap_or(limits::FLEET_BUCKET_REGION_DEFAULT),
    )
    .map_err(|m| err("COMBD_BACKUP_S3_REGION", m))?;
    Ok(Some(BackupBucketSettings {
        url,
        region,
        access_key,
        secret_key_file: PathBuf::from(required("COMBD_BACKUP_S3_SECRET_KEY_FILE")?),
        key_file: PathBuf::from(required("COMBD_BACKUP_KEY_FILE")?),
    }))
}
