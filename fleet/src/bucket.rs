//! The bucket: a minimal S3 client (put, get, delete, list objects) over blocking HTTP.
//!
//! `rusty-s3` signs each request (AWS Signature V4, as a pre-signed URL) without doing any I/O;
//! `ureq` sends it. Every call is over within [`FLEET_BUCKET_TIMEOUT`] and reads at most the
//! bytes its caller accepts; failures say which operation on which key failed and why
//! ([`BucketError`]).

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use combd_kernel::limits::{
    FLEET_BUCKET_RETRIES, FLEET_BUCKET_RETRY_WAIT, FLEET_BUCKET_TIMEOUT,
    FLEET_LIST_ANSWER_MAX_BYTES, FLEET_LIST_PAGE_KEYS,
};
use rusty_s3::actions::{
    DeleteObjects, DeleteObjectsResponse, ListObjectsV2, ObjectIdentifier, S3Action,
};
use rusty_s3::{Credentials, UrlStyle};

use crate::auth::{FleetKey, Sealer};
use crate::http::{self, Failure};
use crate::tls::FleetTls;

/// How long a signed URL stays valid: longer than any call may take, short enough that a
/// captured URL is soon useless.
const SIGNATURE_VALID: Duration = Duration::from_secs(60);
const _: () = assert!(FLEET_BUCKET_TIMEOUT.as_secs() < SIGNATURE_VALID.as_secs());

/// What the MAC of an object stored sealed covers first ([`Bucket::put_sealed`]).
const SEAL_LABEL: &[u8] = b"combd fleet bucket object v1\n";
/// Bytes of the MAC after a sealed object's body.
pub const SEAL_BYTES: usize = 32;

/// The region S3 signatures name when none is given: Garage's default `s3_region`.
pub const DEFAULT_REGION: &str = "garage";

/// A bucket operation that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketError {
    /// `put`, `get`, `delete`, `list`.
    pub op: &'static str,
    /// The key (or the prefix, for `list`).
    pub key: String,
    /// What happened.
    pub failure: Failure,
}

impl std::fmt::Display for BucketError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bucket {} {:?}: {}", self.op, self.key, self.failure)
    }
}

impl std::error::Error for BucketError {}

/// Where the bucket is and how to sign for it.
#[derive(Debug, Clone)]
pub struct BucketConfig {
    /// The S3 endpoint, `http://host:port`.
    pub endpoint: String,
    /// The bucket's name.
    pub bucket: String,
    /// The region signatures name (see [`DEFAULT_REGION`]).
    pub region: String,
    /// The access key id.
    pub access_key: String,
    /// The secret key.
    pub secret_key: String,
}

/// Runs `call` again while the bucket answers a server error (500, 502, 503, 504: S3's "try
/// again"; Garage answers 503 when its metadata database is locked by concurrent writes), at
/// most [`FLEET_BUCKET_RETRIES`] more times, waiting [`FLEET_BUCKET_RETRY_WAIT`], doubled each
/// time. What is tried again stores, reads or deletes the same thing each time.
fn retried<T>(
    tries: &AtomicU64,
    call: impl Fn() -> Result<T, BucketError>,
) -> Result<T, BucketError> {
    let mut wait = FLEET_BUCKET_RETRY_WAIT;
    let mut left = FLEET_BUCKET_RETRIES;
    loop {
        match call() {
            Err(e)
                if left > 0
                    && matches!(
                        e.failure,
                        Failure::Status {
                            code: 500 | 502..=504,
                            ..
                        }
                    ) =>
            {
                std::thread::sleep(wait); // the server asked for a later try
                wait *= 2;
                left -= 1;
                tries.fetch_add(1, Ordering::Relaxed);
            }
            r => return r,
        }
    }
}

/// A file's bytes and then their seal: the body [`Bucket::put_sealed_file`] sends.
struct SealingReader {
    file: std::io::Take<File>,
    /// The file's bytes not read yet.
    left: u64,
    /// Fed each byte read; taken when the last one was.
    sealer: Option<Sealer>,
    seal: [u8; SEAL_BYTES],
    /// How much of `seal` was read (all of it until it is computed).
    sent: usize,
}

impl Read for SealingReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left > 0 {
            let n = self.file.read(buf)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the file shrank while it was sent",
                ));
            }
            self.left -= n as u64;
            if let Some(s) = self.sealer.as_mut() {
                s.update(&buf[..n]);
            }
            return Ok(n);
        }
        if let Some(s) = self.sealer.take() {
            self.seal = s.finish();
            self.sent = 0;
        }
        let n = buf.len().min(SEAL_BYTES - self.sent);
        buf[..n].copy_from_slice(&self.seal[self.sent..self.sent + n]);
        self.sent += n;
        Ok(n)
    }
}

/// A client of one bucket. Calls block: run them on a blocking thread. Clones share their
/// connections.
#[derive(Clone)]
pub struct Bucket {
    bucket: rusty_s3::Bucket,
    credentials: Credentials,
    agent: ureq::Agent,
    /// Calls tried again after a server error, by this client and its clones.
    retries: Arc<AtomicU64>,
    /// The fleet key, which seals what the fleet stores ([`Bucket::put_sealed`]).
    fleet_key: Option<Arc<FleetKey>>,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket")
            .field("url", &self.bucket.base_url().as_str())
            .finish_non_exhaustive()
    }
}

impl Bucket {
    /// A client of the bucket `config` names; fails if the endpoint is not a URL.
    pub fn new(config: &BucketConfig) -> Result<Bucket, BucketError> {
        let bad = |m: String| BucketError {
            op: "configure",
            key: String::new(),
            failure: Failure::BadAnswer(m),
        };
        let endpoint = config
            .endpoint
            .parse()
            .map_err(|e| bad(format!("{}: {e}", config.endpoint)))?;
        let bucket = rusty_s3::Bucket::new(
            endpoint,
            UrlStyle::Path,
            config.bucket.clone(),
            config.region.clone(),
        )
        .map_err(|e| bad(format!("{}: {e}", config.endpoint)))?;
        Ok(Bucket {
            bucket,
            credentials: Credentials::new(config.access_key.clone(), config.secret_key.clone()),
            agent: http::agent(FLEET_BUCKET_TIMEOUT, &FleetTls::default()),
            retries: Arc::new(AtomicU64::new(0)),
            fleet_key: None,
        })
    }

    /// The client, reaching an `https://` endpoint with `tls` (the authorities it trusts)
    /// rather than with the Mozilla roots.
    pub fn with_tls(mut self, tls: &FleetTls) -> Bucket {
        self.agent = http::agent(FLEET_BUCKET_TIMEOUT, tls);
        self
    }

    /// The client, sealing and checking with `key` ([`Bucket::put_sealed`],
    /// [`Bucket::get_sealed`]).
    pub fn with_fleet_key(mut self, key: Arc<FleetKey>) -> Bucket {
        self.fleet_key = Some(key);
        self
    }

    fn fleet_key(&self, op: &'static str, key: &str) -> Result<&FleetKey, BucketError> {
        self.fleet_key.as_deref().ok_or_else(|| {
            Self::error(
                op,
                key,
                Failure::BadAnswer("this bucket client has no fleet key to seal with".into()),
            )
        })
    }

    /// Stores `body` under `key` sealed: followed by the fleet key's MAC of the key and the
    /// body ([`SEAL_BYTES`]), so that [`Bucket::get_sealed`] takes it back only as this
    /// fleet's nodes stored it, and only under this key (a segment or snapshot copied to
    /// another object's or another number's key does not pass).
    pub fn put_sealed(&self, key: &str, mut body: Vec<u8>) -> Result<(), BucketError> {
        let mac = self
            .fleet_key("put", key)?
            .seal(SEAL_LABEL, &[key.as_bytes(), &body]);
        body.extend_from_slice(&mac);
        self.put(key, &body)
    }

    /// What [`Bucket::put_sealed`] stored under `key` (at most `max_bytes` of it), `None` if
    /// there is nothing; [`Failure::NotSealed`] if what is there is not sealed with the fleet
    /// key for this key.
    pub fn get_sealed(&self, key: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, BucketError> {
        let fleet = self.fleet_key("get", key)?;
        let Some(mut bytes) = self.get(key, max_bytes.saturating_add(SEAL_BYTES as u64))? else {
            return Ok(None);
        };
        let body = bytes.len().checked_sub(SEAL_BYTES);
        match body {
            Some(n) if fleet.check(SEAL_LABEL, &[key.as_bytes(), &bytes[..n]], &bytes[n..]) => {
                bytes.truncate(n);
                Ok(Some(bytes))
            }
            _ => Err(Self::error("get", key, Failure::NotSealed)),
        }
    }

    /// [`Bucket::put_sealed`] of the file at `path` (at most `max_bytes`, else
    /// [`Failure::TooLarge`]), read as it is sent: the node never holds it whole. The file must
    /// not change meanwhile (a snapshot's database file does not: its object writes to its WAL
    /// only, and only the snapshot checkpoints). Returns the file's length.
    pub fn put_sealed_file(
        &self,
        key: &str,
        path: &Path,
        max_bytes: u64,
    ) -> Result<u64, BucketError> {
        let fleet = self.fleet_key("put", key)?;
        retried(&self.retries, || {
            let io = |e: std::io::Error| {
                Self::error(
                    "put",
                    key,
                    Failure::BadAnswer(format!("{}: {e}", path.display())),
                )
            };
            let file = File::open(path).map_err(io)?;
            let len = file.metadata().map_err(io)?.len();
            if len > max_bytes {
                return Err(Self::error(
                    "put",
                    key,
                    Failure::TooLarge { limit: max_bytes },
                ));
            }
            let body = SealingReader {
                file: file.take(len),
                left: len,
                sealer: Some(fleet.sealer(SEAL_LABEL, &[key.as_bytes()], len)),
                seal: [0; SEAL_BYTES],
                sent: SEAL_BYTES,
            };
            let url = self
                .bucket
                .put_object(Some(&self.credentials), key)
                .sign(SIGNATURE_VALID);
            let mut resp = self
                .agent
                .put(url.as_str())
                // Sized, not chunked: S3 wants the length of a plain PUT.
                .header("content-length", (len + SEAL_BYTES as u64).to_string())
                .send(ureq::SendBody::from_owned_reader(body))
                .map_err(|e| Self::error("put", key, http::failure(e)))?;
            if !resp.status().is_success() {
                return Err(Self::error("put", key, http::status(&mut resp)));
            }
            Ok(len)
        })
    }

    /// [`Bucket::get_sealed`] written to a new file at `out` as it arrives (never held whole):
    /// `None` if there is nothing under `key` (and no file); its length otherwise. What is not
    /// sealed with the fleet key for this key fails, [`Failure::NotSealed`], and leaves no file.
    pub fn get_sealed_to_file(
        &self,
        key: &str,
        out: &Path,
        max_bytes: u64,
    ) -> Result<Option<u64>, BucketError> {
        let fleet = self.fleet_key("get", key)?;
        let got = retried(&self.retries, || {
            let Some(mut resp) = self.get_response(key)? else {
                return Ok(None);
            };
            let total = resp.body().content_length().ok_or_else(|| {
                Self::error("get", key, Failure::BadAnswer("no content-length".into()))
            })?;
            let len = total
                .checked_sub(SEAL_BYTES as u64)
                .ok_or_else(|| Self::error("get", key, Failure::NotSealed))?;
            if len > max_bytes {
                return Err(Self::error(
                    "get",
                    key,
                    Failure::TooLarge { limit: max_bytes },
                ));
            }
            let mut sealer = fleet.sealer(SEAL_LABEL, &[key.as_bytes()], len);
            let mut body = resp.body_mut().with_config().limit(total).reader();
            let io = |e: std::io::Error| {
                Self::error(
                    "get",
                    key,
                    Failure::BadAnswer(format!("{}: {e}", out.display())),
                )
            };
            let mut file = File::create(out).map_err(io)?;
            let mut buf = vec![0u8; 256 * 1024];
            let mut left = len;
            while left > 0 {
                let want = buf.len().min(left as usize);
                let n = body
                    .read(&mut buf[..want])
                    .map_err(|e| Self::error("get", key, Failure::Unreachable(e.to_string())))?;
                if n == 0 {
                    return Err(Self::error(
                        "get",
                        key,
                        Failure::BadAnswer("cut short".into()),
                    ));
                }
                sealer.update(&buf[..n]);
                file.write_all(&buf[..n]).map_err(io)?;
                left -= n as u64;
            }
            let mut seal = [0u8; SEAL_BYTES];
            body.read_exact(&mut seal)
                .map_err(|e| Self::error("get", key, Failure::Unreachable(e.to_string())))?;
            if !sealer.check(&seal) {
                return Err(Self::error("get", key, Failure::NotSealed));
            }
            file.sync_all().map_err(io)?;
            Ok(Some(len))
        });
        if got.is_err() {
            // Nothing of what failed is left to be taken for the object.
            let _ = std::fs::remove_file(out);
        }
        got
    }

    /// Calls tried again after a server error so far, by this client and its clones.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    fn error(op: &'static str, key: &str, failure: Failure) -> BucketError {
        BucketError {
            op,
            key: key.to_string(),
            failure,
        }
    }

    /// Stores `body` under `key`, replacing what was there (a server error is tried again:
    /// [`retried`]).
    pub fn put(&self, key: &str, body: &[u8]) -> Result<(), BucketError> {
        retried(&self.retries, || self.put_once(key, body))
    }

    fn put_once(&self, key: &str, body: &[u8]) -> Result<(), BucketError> {
        let url = self
            .bucket
            .put_object(Some(&self.credentials), key)
            .sign(SIGNATURE_VALID);
        let mut resp = self
            .agent
            .put(url.as_str())
            .send(body)
            .map_err(|e| Self::error("put", key, http::failure(e)))?;
        if !resp.status().is_success() {
            return Err(Self::error("put", key, http::status(&mut resp)));
        }
        Ok(())
    }

    /// The object under `key`, `None` if there is none; at most `max_bytes` are read (a longer
    /// object fails with [`Failure::TooLarge`]). A server error is tried again ([`retried`]).
    pub fn get(&self, key: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, BucketError> {
        retried(&self.retries, || self.get_once(key, max_bytes))
    }

    fn get_once(&self, key: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, BucketError> {
        let Some(mut resp) = self.get_response(key)? else {
            return Ok(None);
        };
        http::body(&mut resp, max_bytes)
            .map(Some)
            .map_err(|f| Self::error("get", key, f))
    }

    /// A signed GET of `key`: the answer if it succeeded (its body not read yet), `None` if
    /// there is nothing under it, an error for any other status.
    fn get_response(
        &self,
        key: &str,
    ) -> Result<Option<ureq::http::Response<ureq::Body>>, BucketError> {
        let url = self
            .bucket
            .get_object(Some(&self.credentials), key)
            .sign(SIGNATURE_VALID);
        let mut resp = self
            .agent
            .get(url.as_str())
            .call()
            .map_err(|e| Self::error("get", key, http::failure(e)))?;
        match resp.status().as_u16() {
            404 => Ok(None),
            s if (200..300).contains(&s) => Ok(Some(resp)),
            _ => Err(Self::error("get", key, http::status(&mut resp))),
        }
    }

    /// Deletes the object under `key`; deleting a missing key succeeds (as S3 says).
    pub fn delete(&self, key: &str) -> Result<(), BucketError> {
        let url = self
            .bucket
            .delete_object(Some(&self.credentials), key)
            .sign(SIGNATURE_VALID);
        let mut resp = self
            .agent
            .delete(url.as_str())
            .call()
            .map_err(|e| Self::error("delete", key, http::failure(e)))?;
        if !resp.status().is_success() && resp.status().as_u16() != 404 {
            return Err(Self::error("delete", key, http::status(&mut resp)));
        }
        Ok(())
    }

    /// Deletes every key of `keys` (missing ones too, as S3 says), 1,000 to a request
    /// (`DeleteObjects`, the most S3 takes in one); a server error is tried again.
    pub fn delete_many(&self, keys: &[String]) -> Result<(), BucketError> {
        keys.chunks(FLEET_LIST_PAGE_KEYS)
            .try_for_each(|chunk| retried(&self.retries, || self.delete_chunk(chunk)))
    }

    fn delete_chunk(&self, chunk: &[String]) -> Result<(), BucketError> {
        let first = chunk.first().map_or("", String::as_str);
        let ids: Vec<ObjectIdentifier> = chunk
            .iter()
            .map(|k| ObjectIdentifier::new(k.clone()))
            .collect();
        let mut action = DeleteObjects::new(&self.bucket, Some(&self.credentials), ids.iter());
        action.set_quiet(true);
        let url = action.sign(SIGNATURE_VALID);
        let (body, md5) = action.body_with_md5();
        let sent = self
            .agent
            .post(url.as_str())
            .header("content-md5", &md5)
            .send(body.as_bytes());
        let answer = Self::answer("delete", first, sent)?;
        let failed = DeleteObjectsResponse::parse(&answer).map_or_else(
            |e| Some(format!("delete answer XML: {e}")),
            |r| {
                r.errors
                    .first()
                    .map(|e| format!("{}: {} {}", e.key, e.code, e.message))
            },
        );
        match failed {
            Some(m) => Err(Self::error("delete", first, Failure::BadAnswer(m))),
            None => Ok(()),
        }
    }

    /// The text of a successful answer to `op` on `key` (an XML document, at most
    /// [`FLEET_LIST_ANSWER_MAX_BYTES`]); an error for a failed call or an error status.
    fn answer(
        op: &'static str,
        key: &str,
        sent: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<String, BucketError> {
        let mut resp = sent.map_err(|e| Self::error(op, key, http::failure(e)))?;
        if !resp.status().is_success() {
            return Err(Self::error(op, key, http::status(&mut resp)));
        }
        let body = http::body(&mut resp, FLEET_LIST_ANSWER_MAX_BYTES)
            .map_err(|f| Self::error(op, key, f))?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// One page of the keys that start with `prefix`: at most `page_keys`, after `token`
    /// (the previous page's continuation), if any.
    fn list_page(
        &self,
        prefix: &str,
        page_keys: usize,
        token: Option<&str>,
    ) -> Result<rusty_s3::actions::ListObjectsV2Response, BucketError> {
        let mut action = ListObjectsV2::new(&self.bucket, Some(&self.credentials));
        action.with_prefix(prefix);
        action.with_max_keys(page_keys);
        if let Some(t) = token {
            action.with_continuation_token(t.to_string());
        }
        let url = action.sign(SIGNATURE_VALID);
        let text = Self::answer("list", prefix, self.agent.get(url.as_str()).call())?;
        ListObjectsV2::parse_response(&text).map_err(|e| {
            Self::error(
                "list",
                prefix,
                Failure::BadAnswer(format!("listing XML: {e}")),
            )
        })
    }

    /// Calls `each` with every key that starts with `prefix`, in order, a page at a time, until
    /// it answers false (for a listing too long to hold: [`Bucket::list`] is bounded).
    pub fn for_each_key(
        &self,
        prefix: &str,
        mut each: impl FnMut(String) -> bool,
    ) -> Result<(), BucketError> {
        let mut token: Option<String> = None;
        loop {
            let page = self.list_page(prefix, FLEET_LIST_PAGE_KEYS, token.as_deref())?;
            for c in page.contents {
                if !each(c.key) {
                    return Ok(());
                }
            }
            match page.next_continuation_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => return Ok(()),
            }
        }
    }

    /// Whether any key starts with `prefix` (one listing of one key).
    pub fn any(&self, prefix: &str) -> Result<bool, BucketError> {
        Ok(!self.list_page(prefix, 1, None)?.contents.is_empty())
    }

    /// The keys that start with `prefix`, in order, at most `max_keys` of them (a listing
    /// longer than that fails with [`Failure::TooLarge`] rather than being cut silently).
    pub fn list(&self, prefix: &str, max_keys: usize) -> Result<Vec<String>, BucketError> {
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self.list_page(prefix, FLEET_LIST_PAGE_KEYS, token.as_deref())?;
            keys.extend(page.contents.into_iter().map(|c| c.key));
            if keys.len() > max_keys {
                return Err(Self::error(
                    "list",
                    prefix,
                    Failure::TooLarge {
                        limit: max_keys as u64,
                    },
                ));
            }
            match page.next_continuation_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => return Ok(keys),
            }
        }
    }
}
