//! Verified identity: a client's token (a JWT) checked in the node before its request reaches
//! an app or its WebSocket is upgraded (`COMBD_AUTH_JWT_KEY_FILE`, `COMBD_AUTH_ISSUER`,
//! `COMBD_AUTH_AUDIENCE`).
//!
//! - **The key**: an HS256 secret on one line (at least
//!   [`limits::AUTH_HS256_SECRET_MIN_BYTES`]), or a PEM public key: RSA (RS256), P-256 (ES256)
//!   or Ed25519 (EdDSA). One algorithm per key, taken from the key, never from the token's
//!   header (a token that names another algorithm is refused: no `alg: none`, no HS256 token
//!   "signed" with a public key). Read at start-up, where a bad file stops the node, and again
//!   on SIGHUP, where a bad file keeps the old key ([`Auth::reload`]).
//! - **The token**: from `Authorization: Bearer <jwt>`, else a WebSocket subprotocol
//!   `combd.bearer.<jwt>` (browsers cannot set headers on a WebSocket; offered beside `combd`,
//!   which the 101 answers), else the cookie `combd_token`. At most
//!   [`limits::AUTH_TOKEN_MAX_BYTES`].
//! - **What is checked**: the signature; `exp` (required) and `nbf` within
//!   [`limits::AUTH_LEEWAY_SECONDS`]; `iss` and `aud` when set; a `sub` of 1 to
//!   [`limits::AUTH_CLAIM_MAX_BYTES`] bytes; a `name`, if any, within the same bound.
//! - **What it costs**: a token is verified once a shard; seen again (a keep-alive's next
//!   request, a reconnect), it costs a lookup by its SHA-256 until its `exp`, and a refused one
//!   too, so a bad token replayed costs no signature check ([`cache`],
//!   [`limits::AUTH_TOKEN_CACHE_ENTRIES`]; `auth_cache_hits`, `auth_cache_misses`); a token
//!   the cache does not know costs a full check within its client's rate of them
//!   ([`budget`], [`limits::AUTH_VERIFY_RATE_PER_CLIENT`]; past it, `auth_verify_busy`).
//! - **What an app sees**: a [`Client`] (subject and name), never the token. The token is
//!   never logged.
//!
//! The verification is `jsonwebtoken` 12 (Keats; not 9, whose validation skipped an `nbf` or
//! `exp` of the wrong JSON type: CVE-2026-25537), on its RustCrypto backend: nothing here is
//! cryptography written by hand. `exp`, `nbf` and `iat` are NumericDates (RFC 7519): one of
//! another JSON type refuses the token here too, whatever the library checks.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use combd_kernel::fair::ClientKey;
use combd_kernel::limits;
use combd_kernel::settings::AuthSettings;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{DecodingKey, Validation};

mod budget;
mod cache;
mod key;
mod token;
use cache::{Known, Named};
use key::read_key;
pub use key::{hs256_secret, key_from};
pub use token::{mint, offered_protocols, token, BEARER_PROTOCOL_PREFIX, COOKIE, PROTOCOL};

/// The client a verified token names: what an app sees of it (never the token).
#[derive(Clone, PartialEq, Eq)]
pub struct Client {
    /// The token's `sub`.
    pub subject: String,
    /// The token's `name` claim, if any.
    pub name: Option<String>,
    /// The token itself, for a request passed on to its object's owner in a fleet (which
    /// verifies it again); not the app's to see, and never printed.
    token: Box<str>,
    /// The token's `exp`, in seconds since the Unix epoch: a session whose token expired is
    /// closed (3000) at its next ping past it and the leeway.
    expires_at: u64,
    /// The apps its `aud` names it for (`<audience>/<app>`), or `None`: every app.
    apps: Option<Box<[String]>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("subject", &self.subject)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Whether its token is valid for `app` (its `aud` named the node, or that app of it).
    pub fn for_app(&self, app: &str) -> bool {
        self.apps
            .as_deref()
            .is_none_or(|apps| apps.iter().any(|a| a == app))
    }

    /// The token the client came with (for a request passed on to another node).
    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// Whether its token had expired at `now` (seconds since the Unix epoch), past
    /// `AUTH_LEEWAY_SECONDS` as at its verification.
    pub fn expired(&self, now: u64) -> bool {
        now > self.expires_at.saturating_add(limits::AUTH_LEEWAY_SECONDS)
    }
}

/// Why a token was not taken (said in the log at debug level and in nothing the client sees
/// beyond `invalid_token`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No token came with the request.
    Missing,
    /// A token came and failed: why.
    Invalid(String),
    /// A token came that the shard does not know, from a client past its rate of full checks
    /// (`auth_verify_rate_per_client`): not checked.
    Busy,
}

/// A key file that cannot be used: start-up stops, a reload keeps the old key.
#[derive(Debug)]
pub struct KeyError(pub String);

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A key and the validation that goes with it.
#[derive(Clone)]
struct Verifier {
    key: DecodingKey,
    validation: Validation,
    /// `COMBD_AUTH_AUDIENCE`: the node's audience ([`audience`]).
    audience: Option<String>,
    /// This key's own number: no other key read by this process (any [`Auth`]'s, start-up or
    /// reload) has it, so a shard's cache seeing another one forgets what it knew.
    generation: u64,
}

/// The next key's generation.
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's (shard's) copy of the key it last checked a token with.
    static VERIFIER: RefCell<Option<Rc<Verifier>>> = const { RefCell::new(None) };
}

/// A refusal: why, and whether it lasts (not an `nbf` still ahead), so may be remembered.
struct CheckFailure {
    why: String,
    lasting: bool,
}

impl CheckFailure {
    fn lasting(why: impl Into<String>) -> Self {
        CheckFailure {
            why: why.into(),
            lasting: true,
        }
    }
}

/// The node's token verifier. Each shard checks tokens with its own copy of the key
/// ([`Auth::current`]), taken again when a reload changed it: nothing shared is locked, nor
/// any count shared is written but the figures', on a token's way.
pub struct Auth {
    verifier: RwLock<Arc<Verifier>>,
    /// The generation of `verifier`, stored after it changes.
    generation: AtomicU64,
    settings: AuthSettings,
    /// SIGHUP reloads of the key that took effect.
    pub reloads: AtomicU64,
    /// Reloads refused (the old key stayed).
    pub reload_failures: AtomicU64,
    /// Tokens answered from a shard's cache (verified or refused before), every shard together.
    pub cache_hits: AtomicU64,
    /// Tokens verified in full (their signature checked), every shard together.
    pub cache_misses: AtomicU64,
    /// Tokens not checked: their client was past its rate of full checks (`budget`).
    pub verify_busy: AtomicU64,
}

fn verifier(settings: &AuthSettings) -> Result<Verifier, KeyError> {
    let (key, alg) = read_key(&settings.key_file)?;
    let mut validation = Validation::new(alg);
    validation.leeway = limits::AUTH_LEEWAY_SECONDS;
    validation.validate_exp = true;
    validation.validate_nbf = true;
    // jsonwebtoken checks `iss` and `aud` only when a token carries them: a configured one is
    // also required, or a token without it (another service's, signed with the same key)
    // would pass.
    let mut required = vec!["exp", "sub"];
    if settings.issuer.is_some() {
        required.push("iss");
    }
    if settings.audience.is_some() {
        required.push("aud");
    }
    validation.set_required_spec_claims(&required);
    match &settings.issuer {
        Some(iss) => validation.set_issuer(&[iss]),
        None => validation.iss = None,
    }
    // The audience is checked here, not by the library: besides the node's own, a token may
    // name apps of it (`<audience>/<app>`), and is then for those apps only ([`audience`]).
    validation.validate_aud = false;
    Ok(Verifier {
        key,
        validation,
        audience: settings.audience.clone(),
        generation: GENERATIONS.fetch_add(1, Ordering::Relaxed),
    })
}

impl Auth {
    /// Reads the key once (start-up fails on an error).
    pub fn new(settings: AuthSettings) -> Result<Auth, KeyError> {
        let v = verifier(&settings)?;
        Ok(Auth {
            generation: AtomicU64::new(v.generation),
            verifier: RwLock::new(Arc::new(v)),
            settings,
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            cache_misses: AtomicU64::new(0),
            verify_busy: AtomicU64::new(0),
        })
    }

    /// Reads the key file again; a bad file is refused and the old key stays.
    pub fn reload(&self) -> Result<(), KeyError> {
        match verifier(&self.settings) {
            Ok(v) => {
                self.reloads.fetch_add(1, Ordering::Relaxed);
                let generation = v.generation;
                match self.verifier.write() {
                    Ok(mut cur) => *cur = Arc::new(v),
                    Err(poisoned) => *poisoned.into_inner() = Arc::new(v),
                }
                self.generation.store(generation, Ordering::Release);
                Ok(())
            }
            Err(e) => {
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// This thread's (shard's) copy of the key, taken again when its generation is not the
    /// node's (one atomic load): a reload, or another node's [`Auth`] on the thread.
    fn current(&self) -> Rc<Verifier> {
        let generation = self.generation.load(Ordering::Acquire);
        VERIFIER.with(|c| {
            let mut c = c.borrow_mut();
            match &*c {
                Some(v) if v.generation == generation => v.clone(),
                _ => {
                    let shared = match self.verifier.read() {
                        Ok(v) => v.clone(),
                        Err(poisoned) => poisoned.into_inner().clone(),
                    };
                    let v = Rc::new(Verifier::clone(&shared));
                    *c = Some(v.clone());
                    v
                }
            }
        })
    }

    /// Verifies `token`: the client it names, or why not. Once a shard: seen again, the
    /// shard's cache answers (until the token's `exp`, or a new key).
    pub fn verify(&self, token: &[u8]) -> Result<Client, Refused> {
        self.verify_for(token, ClientKey::Local)
    }

    /// [`Auth::verify`] for a token `asker` sent: a token the shard's cache does not know is
    /// checked in full only within the asker's rate of full checks ([`budget`]); past it,
    /// [`Refused::Busy`].
    pub fn verify_for(&self, token: &[u8], asker: ClientKey) -> Result<Client, Refused> {
        if token.len() > limits::AUTH_TOKEN_MAX_BYTES {
            return Err(Refused::Invalid(format!(
                "longer than {} bytes",
                limits::AUTH_TOKEN_MAX_BYTES
            )));
        }
        let token = std::str::from_utf8(token).map_err(|_| Refused::Invalid("not text".into()))?;
        let v = self.current();
        let d = cache::digest(token.as_bytes());
        match cache::with(|c| c.look(v.generation, &d, unix_now())) {
            Known::Verified(named) => {
                self.cache_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(named.client(token));
            }
            Known::Refused(why) => {
                self.cache_hits.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::Invalid(why));
            }
            Known::Unseen => {
                if !budget::spend(asker) {
                    self.verify_busy.fetch_add(1, Ordering::Relaxed);
                    return Err(Refused::Busy);
                }
                self.cache_misses.fetch_add(1, Ordering::Relaxed)
            }
        };
        match check(&v, token) {
            Ok(named) => {
                cache::with(|c| c.verified(v.generation, d, named.clone()));
                Ok(named.client(token))
            }
            Err(f) => {
                if f.lasting {
                    cache::with(|c| c.refused(v.generation, d, &f.why));
                }
                Err(Refused::Invalid(f.why))
            }
        }
    }

    /// The cache's figures for `/stats` (zero without a key).
    #[rustfmt::skip]
    pub fn figures(auth: Option<&Auth>) -> Vec<crate::stats::Field> {
        use crate::stats::Kind::Counter;
        let g = |f: fn(&Auth) -> &AtomicU64| auth.map_or(0, |a| f(a).load(Ordering::Relaxed));
        vec![
            ("auth_cache_hits", "combd_auth_cache_hits_total", Counter, "Tokens answered from a shard's cache of tokens verified or refused before.", g(|a| &a.cache_hits)),
            ("auth_cache_misses", "combd_auth_cache_misses_total", Counter, "Tokens verified in full (signature checked): not in their shard's cache.", g(|a| &a.cache_misses)),
            ("auth_verify_busy", "combd_auth_verify_busy_total", Counter, "Tokens not checked: their client was past its rate of full checks on the shard.", g(|a| &a.verify_busy)),
        ]
    }
}

/// Seconds since the Unix epoch, as the token's claims count them.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Verifies `token` in full with `v`: its signature, its claims.
fn check(v: &Verifier, token: &str) -> Result<Named, CheckFailure> {
    let data =
        jsonwebtoken::decode::<serde_json::Value>(token, &v.key, &v.validation).map_err(|e| {
            CheckFailure {
                lasting: !matches!(e.kind(), ErrorKind::ImmatureSignature),
                why: e.to_string(),
            }
        })?;
    numeric_dates(&data.claims)?;
    let claim = |name: &str| -> Result<Option<String>, CheckFailure> {
        match data.claims.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s))
                if !s.is_empty() && s.len() <= limits::AUTH_CLAIM_MAX_BYTES =>
            {
                Ok(Some(s.clone()))
            }
            Some(_) => Err(CheckFailure::lasting(format!(
                "{name} must be a string of 1 to {} bytes",
                limits::AUTH_CLAIM_MAX_BYTES
            ))),
        }
    };
    let apps = audience(v.audience.as_deref(), data.claims.get("aud"))?;
    let subject = claim("sub")?.ok_or_else(|| CheckFailure::lasting("no sub"))?;
    // Required and checked by the validation: a number.
    let expires_at = data.claims.get("exp").and_then(serde_json::Value::as_u64);
    Ok(Named {
        subject,
        name: claim("name")?,
        expires_at: expires_at.ok_or_else(|| CheckFailure::lasting("exp is not a number"))?,
        apps,
    })
}

/// The apps a token's `aud` makes it valid for, with `COMBD_AUTH_AUDIENCE` `node`: with none
/// set, every app (its `aud` not read); else `aud` (a string or an array of them) must name the
/// node (every app) or apps of it as `<node>/<app>` (those apps only: a token for one app is
/// not one for all).
fn audience(
    node: Option<&str>,
    aud: Option<&serde_json::Value>,
) -> Result<Option<Box<[String]>>, CheckFailure> {
    let Some(node) = node else {
        return Ok(None);
    };
    let named: Vec<&str> = match aud {
        Some(serde_json::Value::String(s)) => vec![s.as_str()],
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_str()).collect(),
        _ => return Err(CheckFailure::lasting("aud is missing or not a string")),
    };
    if named.contains(&node) {
        return Ok(None);
    }
    let apps: Vec<String> = named
        .iter()
        .filter_map(|a| a.strip_prefix(node)?.strip_prefix('/'))
        .filter(|app| !app.is_empty())
        .map(str::to_string)
        .collect();
    if apps.is_empty() {
        return Err(CheckFailure::lasting(
            "InvalidAudience: aud names neither this node nor an app of it",
        ));
    }
    Ok(Some(apps.into_boxed_slice()))
}

/// `exp`, `nbf` and `iat`, where present, are numbers (RFC 7519's NumericDate): a string
/// `nbf` far in the future is not taken as no `nbf` at all.
fn numeric_dates(claims: &serde_json::Value) -> Result<(), CheckFailure> {
    for name in ["exp", "nbf", "iat"] {
        if claims.get(name).is_some_and(|v| !v.is_number()) {
            return Err(CheckFailure::lasting(format!(
                "{name} is not a NumericDate"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
