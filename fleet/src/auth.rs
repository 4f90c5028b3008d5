//! The fleet's trust zone: what one node sends another is signed with the fleet key, and a
//! node takes from the fleet only what is signed.
//!
//! Every node of a fleet reads the same secret from `COMBD_FLEET_KEY_FILE` at start-up. A
//! request one node passes on to another (an HTTP request for an object the other owns, or a
//! WebSocket's upgrade) carries [`AUTH_HEADER`]:
//!
//! ```text
//! combd-fleet-auth: v2 <unix ms> <nonce, 32 hex digits> <HMAC-SHA-256, 64 hex digits>
//! ```
//!
//! The MAC (`ring`'s HMAC-SHA-256, compared in constant time by `subtle`) covers a label of the format, the
//! receiving node's fleet address (`COMBD_FLEET_NODE` as it is recorded in the coordinator),
//! the method, the request target, the client's address a passed-on request carries
//! ([`CLIENT_HEADER`](crate::forward::CLIENT_HEADER), empty if none), the time, the nonce and
//! the SHA-256 of the body. The
//! receiver ([`FleetKey::verify`], then [`Replays::admit`]) refuses a request whose MAC does not
//! match what it received, whose time is more than [`FLEET_AUTH_SKEW`] from its own clock, or
//! whose time and nonce it has taken before: a request captured on the fleet's network cannot
//! be replayed later, nor to another node, nor with another body.
//!
//! **Why an HMAC and not mutual TLS.** One secret file to hand to every node (and to change
//! by restarting them), instead of a certificate authority, a certificate and key per node,
//! and their expiry to watch; the fleet's HTTP client and the WebSocket pass-through (plain
//! sockets on the shard's io_uring) carry it as one header, with no TLS handshake per
//! connection to another node. What mutual TLS would add is privacy of the fleet's traffic;
//! run the fleet network where that is given (a private network, WireGuard) — README, "The
//! fleet", says so.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use combd_kernel::fair::ClientKey;
use combd_kernel::limits::{FLEET_AUTH_REPLAYS_MAX, FLEET_AUTH_SKEW, FLEET_KEY_MIN_BYTES};
use combd_kernel::settings::ConfigError;
use ring::{digest, hmac, rand::SecureRandom};

/// The header a signed fleet request carries.
pub const AUTH_HEADER: &str = "combd-fleet-auth";
/// The first word of [`AUTH_HEADER`]'s value: the format of what follows.
const VERSION: &str = "v2";
/// What the MAC of a request starts with, so a MAC made for anything else the fleet key signs
/// can never pass for a request's.
const REQUEST_LABEL: &[u8] = b"combd fleet request v2\n";
/// Bytes of a request's nonce.
const NONCE_BYTES: usize = 16;
/// The header an owner's answer to a signed request carries: [`FleetKey::sign_answer`]'s MAC,
/// in hex.
pub const ANSWER_HEADER: &str = "combd-fleet-answer";
/// What the MAC of an owner's answer starts with ([`REQUEST_LABEL`]'s reason).
const ANSWER_LABEL: &[u8] = b"combd fleet answer v1\n";

/// The fleet key.
pub struct FleetKey {
    key: hmac::Key,
}

impl fmt::Debug for FleetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FleetKey(..)")
    }
}

/// The fleet key in a key file's text: its one line, trimmed, printable ASCII without spaces,
/// at least [`FLEET_KEY_MIN_BYTES`] long. The error never shows the key.
pub fn parse_fleet_key(text: &str) -> Result<FleetKey, String> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let key = lines.next().ok_or_else(|| {
        "is empty: it must hold the fleet key on one line (make one with `openssl rand -hex 32`)"
            .to_string()
    })?;
    if lines.next().is_some() {
        return Err("holds more than one line: only the fleet key".to_string());
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("the fleet key must be printable ASCII without spaces".to_string());
    }
    if key.len() < FLEET_KEY_MIN_BYTES {
        return Err(format!(
            "the fleet key is {} bytes: at least {FLEET_KEY_MIN_BYTES} (make one with \
             `openssl rand -hex 32`)",
            key.len()
        ));
    }
    Ok(FleetKey {
        key: hmac::Key::new(hmac::HMAC_SHA256, key.as_bytes()),
    })
}

/// Reads the fleet key from `path`; the error names `COMBD_FLEET_KEY_FILE` and the file,
/// never the key.
pub fn read_fleet_key(path: &Path) -> Result<FleetKey, ConfigError> {
    read_key_of("COMBD_FLEET_KEY_FILE", path)
}

/// Reads a key of the fleet key's form from `path`, which `setting` names (the backup's, which
/// seals what it stores in a bucket, `COMBD_BACKUP_KEY_FILE`); the error names both, never the
/// key.
pub fn read_key_of(setting: &str, path: &Path) -> Result<FleetKey, ConfigError> {
    crate::key_file::read_key_file(setting, path, parse_fleet_key)
}

/// Why a request from the fleet was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// It carries no [`AUTH_HEADER`].
    Missing,
    /// Its [`AUTH_HEADER`] is not in the format.
    Malformed,
    /// Its time is more than [`FLEET_AUTH_SKEW`] from the receiver's clock.
    Stale,
    /// Its MAC is not the fleet key's over what was received.
    BadMac,
    /// It was taken before.
    Replayed,
    /// The receiver remembers [`FLEET_AUTH_REPLAYS_MAX`] requests already: try again.
    Busy,
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AuthError::Missing => "no fleet signature",
            AuthError::Malformed => "malformed fleet signature",
            AuthError::Stale => "fleet signature out of date (clocks apart?)",
            AuthError::BadMac => "bad fleet signature",
            AuthError::Replayed => "fleet request replayed",
            AuthError::Busy => "too many fleet requests to remember",
        })
    }
}

/// A good signature's time and nonce: what [`Replays`] remembers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp {
    at_ms: u64,
    nonce: [u8; NONCE_BYTES],
}

/// Milliseconds since the Unix epoch now (0 for a clock before it).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A seal being computed over a body that comes in pieces ([`FleetKey::sealer`]).
pub struct Sealer(hmac::Context);

impl Sealer {
    /// The next piece of the body.
    pub fn update(&mut self, piece: &[u8]) {
        self.0.update(piece);
    }

    /// The seal, once every byte of the body was fed.
    pub fn finish(self) -> [u8; 32] {
        let mut out = [0; 32];
        out.copy_from_slice(self.0.sign().as_ref());
        out
    }

    /// Whether `mac` is the seal, compared in constant time.
    pub fn check(self, mac: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        mac.len() == 32 && bool::from(self.finish()[..].ct_eq(mac))
    }
}

impl FleetKey {
    /// The fleet key's MAC of `parts` after `label` (each part's length before it, so no two
    /// different lists of parts have the same MAC). Every label the fleet signs under is its
    /// own: a MAC made for one kind of thing never passes for another's.
    pub fn seal(&self, label: &[u8], parts: &[&[u8]]) -> [u8; 32] {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(label);
        for part in parts {
            ctx.update(&(part.len() as u64).to_le_bytes());
            ctx.update(part);
        }
        let mut out = [0; 32];
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }

    /// [`FleetKey::seal`] of `parts` and then a last part of `body_len` bytes, the last part
    /// fed piece by piece ([`Sealer::update`]): a body sealed as it is read or written, never
    /// held whole.
    pub fn sealer(&self, label: &[u8], parts: &[&[u8]], body_len: u64) -> Sealer {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(label);
        for part in parts {
            ctx.update(&(part.len() as u64).to_le_bytes());
            ctx.update(part);
        }
        ctx.update(&body_len.to_le_bytes());
        Sealer(ctx)
    }

    /// Whether `mac` is [`FleetKey::seal`]'s of `parts` after `label`, compared in constant
    /// time.
    pub fn check(&self, label: &[u8], parts: &[&[u8]], mac: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        mac.len() == 32 && bool::from(self.seal(label, parts)[..].ct_eq(mac))
    }

    /// The [`ANSWER_HEADER`] value of an owner's answer to the request whose [`AUTH_HEADER`]
    /// value was `request` (so an answer passes for that request's only): its status, the
    /// fields the node passing it on keeps (`fields`: `name: value` lines, as
    /// `crate::forward::answer_fields` makes them) and its body.
    pub fn sign_answer(&self, request: &str, status: u16, fields: &str, body: &[u8]) -> String {
        answer_parts(request, status, fields, body, |p| {
            hex(&self.seal(ANSWER_LABEL, p))
        })
    }

    /// Whether `mac` (the answer's [`ANSWER_HEADER`], if any) is [`FleetKey::sign_answer`]'s.
    pub fn check_answer(
        &self,
        mac: Option<&str>,
        request: &str,
        status: u16,
        fields: &str,
        body: &[u8],
    ) -> bool {
        let Some(mac) = mac.and_then(|m| unhex(m.trim())) else {
            return false;
        };
        answer_parts(request, status, fields, body, |p| {
            self.check(ANSWER_LABEL, p, &mac)
        })
    }

    /// The [`AUTH_HEADER`] value of `method target` with `body`, to the node at `to`, signed
    /// now with a fresh random nonce.
    pub fn sign(&self, to: &str, method: &str, target: &str, body: &[u8]) -> String {
        self.sign_for(to, method, target, "", body)
    }

    /// [`FleetKey::sign`] of a request passed on for a client: `client` is the value of its
    /// [`CLIENT_HEADER`](crate::forward::CLIENT_HEADER) (the client's address, as the node it
    /// connected to saw it), which the MAC covers.
    pub fn sign_for(
        &self,
        to: &str,
        method: &str,
        target: &str,
        client: &str,
        body: &[u8],
    ) -> String {
        let mut nonce = [0u8; NONCE_BYTES];
        // The system's random source does not fail on Linux once the kernel's pool is
        // initialised (getrandom(2) blocks until then); a zero nonce would still be refused
        // only as a replay, never taken twice.
        let _ = ring::rand::SystemRandom::new().fill(&mut nonce);
        self.sign_at(to, method, target, client, body, now_ms(), nonce)
    }

    /// [`FleetKey::sign`] at a given time and nonce (for tests of the receiver).
    #[allow(clippy::too_many_arguments)]
    pub fn sign_at(
        &self,
        to: &str,
        method: &str,
        target: &str,
        client: &str,
        body: &[u8],
        at_ms: u64,
        nonce: [u8; NONCE_BYTES],
    ) -> String {
        let stamp = Stamp { at_ms, nonce };
        let mac = request_parts(to, method, target, client, &stamp, body, |p| {
            self.seal(REQUEST_LABEL, p)
        });
        format!("{VERSION} {at_ms} {} {}", hex(&nonce), hex(&mac))
    }

    /// Checks `value` (the request's [`AUTH_HEADER`], if any) against the request this node,
    /// at fleet address `me`, received, at `now_ms`; its stamp, for [`Replays::admit`].
    /// `client`: the request's [`CLIENT_HEADER`](crate::forward::CLIENT_HEADER) value, or
    /// empty.
    #[allow(clippy::too_many_arguments)]
    pub fn verify(
        &self,
        value: Option<&[u8]>,
        me: &str,
        method: &str,
        target: &str,
        client: &str,
        body: &[u8],
        now_ms: u64,
    ) -> Result<Stamp, AuthError> {
        let value = value.ok_or(AuthError::Missing)?;
        let text = std::str::from_utf8(value).map_err(|_| AuthError::Malformed)?;
        let mut words = text.trim().split(' ');
        let (Some(VERSION), Some(at), Some(nonce), Some(mac), None) = (
            words.next(),
            words.next(),
            words.next(),
            words.next(),
            words.next(),
        ) else {
            return Err(AuthError::Malformed);
        };
        let at_ms: u64 = at
            .parse()
            .ok()
            .filter(|_| at.bytes().all(|b| b.is_ascii_digit()))
            .ok_or(AuthError::Malformed)?;
        let nonce: [u8; NONCE_BYTES] = unhex(nonce)
            .and_then(|n| n.try_into().ok())
            .ok_or(AuthError::Malformed)?;
        let mac = unhex(mac)
            .filter(|m| m.len() == 32)
            .ok_or(AuthError::Malformed)?;
        let stamp = Stamp { at_ms, nonce };
        if !request_parts(me, method, target, client, &stamp, body, |p| {
            self.check(REQUEST_LABEL, p, &mac)
        }) {
            return Err(AuthError::BadMac);
        }
        if at_ms.abs_diff(now_ms) > FLEET_AUTH_SKEW.as_millis() as u64 {
            return Err(AuthError::Stale);
        }
        Ok(stamp)
    }
}

/// What an answer's MAC covers (after [`ANSWER_LABEL`]), handed to `f`: the request's
/// [`AUTH_HEADER`] value, the status, the fields kept (`crate::forward::answer_fields`) and the
/// body's SHA-256.
fn answer_parts<R>(
    request: &str,
    status: u16,
    fields: &str,
    body: &[u8],
    f: impl FnOnce(&[&[u8]]) -> R,
) -> R {
    let status = status.to_le_bytes();
    let body = digest::digest(&digest::SHA256, body);
    f(&[
        request.as_bytes(),
        &status,
        fields.as_bytes(),
        body.as_ref(),
    ])
}

/// What a request's MAC covers (after [`REQUEST_LABEL`]), handed to `f`: the receiving node's
/// fleet address, the method, the target, the client it was passed on for, the time, the nonce
/// and the body's SHA-256.
fn request_parts<R>(
    to: &str,
    method: &str,
    target: &str,
    client: &str,
    stamp: &Stamp,
    body: &[u8],
    f: impl FnOnce(&[&[u8]]) -> R,
) -> R {
    let at = stamp.at_ms.to_le_bytes();
    let body = digest::digest(&digest::SHA256, body);
    f(&[
        to.as_bytes(),
        method.as_bytes(),
        target.as_bytes(),
        client.as_bytes(),
        &at,
        &stamp.nonce,
        body.as_ref(),
    ])
}

/// The signed requests a node has taken lately: each refused if seen again while its time is
/// within [`FLEET_AUTH_SKEW`] of the clock (an older one is refused as stale anyway), each
/// counted to the peer it came from (its connection's address): a peer may hold its share of
/// the [`FLEET_AUTH_REPLAYS_MAX`] remembered, the bound split over the peers holding some, so a
/// client that drives forwards through one node fills that node's share, not every node's.
///
/// What a node took before it started again is not remembered across the restart: instead a
/// request signed before this node's start ([`Replays::since`]) is refused as stale, so one
/// captured before a restart cannot be replayed after it within the skew.
#[derive(Debug, Default)]
pub struct Replays {
    seen: Mutex<Seen>,
    /// Requests signed before this (ms since the Unix epoch) are refused: the node's start.
    since_ms: u64,
}

#[derive(Debug, Default)]
struct Seen {
    /// Each stamp remembered, with the peer it came from.
    stamps: BTreeMap<Stamp, ClientKey>,
    /// What each peer holds of them.
    by_peer: HashMap<ClientKey, usize>,
}

impl Seen {
    /// Forgets the stamps older than `oldest`.
    fn forget_before(&mut self, oldest: u64) {
        if !self
            .stamps
            .first_key_value()
            .is_some_and(|(s, _)| s.at_ms < oldest)
        {
            return;
        }
        let kept = self.stamps.split_off(&Stamp {
            at_ms: oldest,
            nonce: [0; NONCE_BYTES],
        });
        for peer in std::mem::replace(&mut self.stamps, kept).into_values() {
            if let Some(n) = self.by_peer.get_mut(&peer) {
                *n -= 1;
                if *n == 0 {
                    self.by_peer.remove(&peer);
                }
            }
        }
    }

    /// Whether `peer` holds its share: the bound over the peers holding some (it counted).
    fn at_share(&self, peer: ClientKey) -> bool {
        let mine = self.by_peer.get(&peer).copied().unwrap_or(0);
        let active = self.by_peer.len() + usize::from(mine == 0);
        mine >= FLEET_AUTH_REPLAYS_MAX / active.max(1)
            || self.stamps.len() >= FLEET_AUTH_REPLAYS_MAX
    }
}

impl Replays {
    /// What a node that started at `start_ms` remembers: nothing yet, and no request signed
    /// before its start taken.
    pub fn since(start_ms: u64) -> Replays {
        Replays {
            seen: Mutex::default(),
            since_ms: start_ms,
        }
    }

    /// Takes `stamp` (a good signature's, from `peer`) at `now_ms`: refused if taken before,
    /// signed before the node started, or if the peer holds its share of the
    /// [`FLEET_AUTH_REPLAYS_MAX`] remembered.
    pub fn admit(&self, stamp: Stamp, peer: ClientKey, now_ms: u64) -> Result<(), AuthError> {
        if stamp.at_ms < self.since_ms {
            return Err(AuthError::Stale);
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.forget_before(now_ms.saturating_sub(FLEET_AUTH_SKEW.as_millis() as u64));
        if seen.stamps.contains_key(&stamp) {
            return Err(AuthError::Replayed);
        }
        if seen.at_share(peer) {
            return Err(AuthError::Busy);
        }
        seen.stamps.insert(stamp, peer);
        *seen.by_peer.entry(peer).or_insert(0) += 1;
        Ok(())
    }

    /// How many are remembered now.
    pub fn held(&self) -> usize {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stamps
            .len()
    }
}

/// A new random id: 16 bytes from the system's random source, in hex.
pub fn random_id() -> Result<String, String> {
    let mut raw = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut raw)
        .map_err(|_| "the system's random source failed".to_string())?;
    Ok(hex(&raw))
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// The bytes of hex text (either case); `None` if it is not.
fn unhex(text: &str) -> Option<Vec<u8>> {
    let t = text.as_bytes();
    if !t.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    t.chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const PEER: ClientKey = ClientKey::V4(0x0a00_0001);

    const KEY: &str = "0123456789abcdef0123456789abcdef";
    const ME: &str = "10.0.0.2:7946";

    fn key() -> FleetKey {
        parse_fleet_key(KEY).unwrap()
    }

    #[test]
    fn a_body_sealed_in_pieces_has_the_seal_of_the_whole() {
        let body: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let whole = key().seal(b"label", &[b"the key", &body]);
        let mut sealer = key().sealer(b"label", &[b"the key"], body.len() as u64);
        for piece in body.chunks(777) {
            sealer.update(piece);
        }
        assert_eq!(sealer.finish(), whole);
        // The body's length is sealed too: the same bytes announced one short do not pass.
        let mut short = key().sealer(b"label", &[b"the key"], body.len() as u64 - 1);
        short.update(&body);
        assert!(!short.check(&whole));
        let mut again = key().sealer(b"label", &[b"the key"], body.len() as u64);
        again.update(&body);
        assert!(again.check(&whole));
    }

    #[test]
    fn a_key_file_holds_one_long_enough_key_on_one_line() {
        assert!(parse_fleet_key(&format!("\n {KEY} \n")).is_ok());
        assert!(parse_fleet_key("").unwrap_err().contains("empty"));
        assert!(parse_fleet_key(&format!("{KEY}\n{KEY}"))
            .unwrap_err()
            .contains("more than one line"));
        assert!(parse_fleet_key(&format!("{KEY} x"))
            .unwrap_err()
            .contains("printable"));
        let short = parse_fleet_key(&KEY[..31]).unwrap_err();
        assert!(short.contains("31 bytes: at least 32"), "{short}");
        assert!(
            !short.contains(&KEY[..31]),
            "the error shows the key: {short}"
        );
        let e = read_fleet_key(Path::new("/nonexistent/combd-fleet-key")).unwrap_err();
        assert_eq!(e.setting, "COMBD_FLEET_KEY_FILE");
    }

    #[test]
    fn a_signed_request_verifies_and_any_change_to_it_does_not() {
        let k = key();
        let now = 1_800_000_000_000;
        let nonce = [7; NONCE_BYTES];
        let v = k.sign_at(ME, "POST", "/o/counter/a", "", b"{}", now, nonce);
        let ok = k.verify(
            Some(v.as_bytes()),
            ME,
            "POST",
            "/o/counter/a",
            "",
            b"{}",
            now + 5,
        );
        assert_eq!(ok.unwrap(), Stamp { at_ms: now, nonce });
        let check = |value: &str, me: &str, method: &str, target: &str, body: &[u8], at: u64| {
            k.verify(Some(value.as_bytes()), me, method, target, "", body, at)
        };
        let bad = Err(AuthError::BadMac);
        assert_eq!(
            check(&v, "10.0.0.3:7946", "POST", "/o/counter/a", b"{}", now),
            bad
        );
        assert_eq!(check(&v, ME, "GET", "/o/counter/a", b"{}", now), bad);
        assert_eq!(check(&v, ME, "POST", "/o/counter/b", b"{}", now), bad);
        assert_eq!(check(&v, ME, "POST", "/o/counter/a", b"{ }", now), bad);
        // The parts are length-prefixed: moving a byte from one to the next changes the MAC.
        let moved = k.sign_at(ME, "POS", "T/o/counter/a", "", b"{}", now, nonce);
        assert_eq!(check(&moved, ME, "POST", "/o/counter/a", b"{}", now), bad);
        // The client it was passed on for is covered: another address does not pass.
        let vouched = k.sign_at(ME, "POST", "/o/counter/a", "192.0.2.7", b"{}", now, nonce);
        let as_other = k.verify(
            Some(vouched.as_bytes()),
            ME,
            "POST",
            "/o/counter/a",
            "192.0.2.8",
            b"{}",
            now,
        );
        assert_eq!(as_other, bad);
        assert!(k
            .verify(
                Some(vouched.as_bytes()),
                ME,
                "POST",
                "/o/counter/a",
                "192.0.2.7",
                b"{}",
                now
            )
            .is_ok());
        // Another key's signature.
        let other = parse_fleet_key(&KEY.replace('0', "1")).unwrap();
        let forged = other.sign_at(ME, "POST", "/o/counter/a", "", b"{}", now, nonce);
        assert_eq!(check(&forged, ME, "POST", "/o/counter/a", b"{}", now), bad);
        // The time or the nonce changed after signing.
        let words: Vec<&str> = v.split(' ').collect();
        let later = format!("v2 {} {} {}", now + 1, words[2], words[3]);
        assert_eq!(check(&later, ME, "POST", "/o/counter/a", b"{}", now), bad);
        let renonced = format!("v2 {now} {} {}", hex(&[8; NONCE_BYTES]), words[3]);
        assert_eq!(
            check(&renonced, ME, "POST", "/o/counter/a", b"{}", now),
            bad
        );
    }

    #[test]
    fn a_signature_out_of_the_skew_or_out_of_format_is_refused() {
        let k = key();
        let now = 1_800_000_000_000;
        let skew = FLEET_AUTH_SKEW.as_millis() as u64;
        for (at, ok) in [
            (now - skew, true),
            (now + skew, true),
            (now - skew - 1, false),
            (now + skew + 1, false),
        ] {
            let v = k.sign_at(ME, "GET", "/o/x/y", "", b"", at, [1; NONCE_BYTES]);
            let r = k.verify(Some(v.as_bytes()), ME, "GET", "/o/x/y", "", b"", now);
            assert_eq!(r.is_ok(), ok, "signed at now{:+}", at as i64 - now as i64);
            if !ok {
                assert_eq!(r, Err(AuthError::Stale));
            }
        }
        assert_eq!(
            k.verify(None, ME, "GET", "/", "", b"", now),
            Err(AuthError::Missing)
        );
        let good = k.sign_at(ME, "GET", "/", "", b"", now, [1; NONCE_BYTES]);
        let w: Vec<&str> = good.split(' ').collect();
        for bad in [
            String::new(),
            "v2".into(),
            format!("v3 {} {} {}", w[1], w[2], w[3]),
            format!("v1 {} {} {}", w[1], w[2], w[3]),
            format!("v2 +{} {} {}", w[1], w[2], w[3]),
            format!("v2 {} {} {}", w[1], &w[2][..30], w[3]),
            format!("v2 {} {} {}", w[1], w[2], &w[3][..62]),
            format!("v2 {} {}x {}", w[1], &w[2][..31], w[3]),
            format!("{good} extra"),
            format!("v2  {} {} {}", w[1], w[2], w[3]),
        ] {
            assert_eq!(
                k.verify(Some(bad.as_bytes()), ME, "GET", "/", "", b"", now),
                Err(AuthError::Malformed),
                "{bad:?}"
            );
        }
        assert_eq!(
            k.verify(Some(&[0xff, 0xfe]), ME, "GET", "/", "", b"", now),
            Err(AuthError::Malformed)
        );
    }

    #[test]
    fn a_request_is_taken_once_and_forgotten_once_out_of_date() {
        let r = Replays::default();
        let now = 1_800_000_000_000;
        let a = Stamp {
            at_ms: now,
            nonce: [1; NONCE_BYTES],
        };
        let b = Stamp {
            at_ms: now,
            nonce: [2; NONCE_BYTES],
        };
        assert_eq!(r.admit(a, PEER, now), Ok(()));
        assert_eq!(r.admit(a, PEER, now + 1), Err(AuthError::Replayed));
        assert_eq!(r.admit(b, PEER, now + 1), Ok(()));
        assert_eq!(r.held(), 2);
        let later = now + FLEET_AUTH_SKEW.as_millis() as u64 + 1;
        let c = Stamp {
            at_ms: later,
            nonce: [1; NONCE_BYTES],
        };
        assert_eq!(r.admit(c, PEER, later), Ok(()));
        assert_eq!(r.held(), 1, "the out-of-date ones are forgotten");
    }

    #[test]
    fn past_the_bound_a_request_is_refused_busy_not_taken_unremembered() {
        let r = Replays::default();
        let now = 1_800_000_000_000;
        for i in 0..FLEET_AUTH_REPLAYS_MAX as u64 {
            let mut nonce = [0; NONCE_BYTES];
            nonce[..8].copy_from_slice(&i.to_le_bytes());
            r.admit(Stamp { at_ms: now, nonce }, PEER, now).unwrap();
        }
        let one_more = Stamp {
            at_ms: now,
            nonce: [0xff; NONCE_BYTES],
        };
        assert_eq!(r.admit(one_more, PEER, now), Err(AuthError::Busy));
        assert_eq!(r.held(), FLEET_AUTH_REPLAYS_MAX);
    }

    #[test]
    fn a_request_signed_before_the_node_started_is_stale() {
        let now = 1_800_000_000_000;
        let r = Replays::since(now);
        let before = Stamp {
            at_ms: now - 1,
            nonce: [1; NONCE_BYTES],
        };
        assert_eq!(r.admit(before, PEER, now + 5), Err(AuthError::Stale));
        let after = Stamp {
            at_ms: now,
            nonce: [1; NONCE_BYTES],
        };
        assert_eq!(r.admit(after, PEER, now + 5), Ok(()));
    }

    #[test]
    fn one_peer_at_its_share_leaves_the_others_theirs() {
        let r = Replays::default();
        let now = 1_800_000_000_000;
        let other = ClientKey::V4(0x0a00_0002);
        let stamp = |i: u64| {
            let mut nonce = [0; NONCE_BYTES];
            nonce[..8].copy_from_slice(&i.to_le_bytes());
            Stamp { at_ms: now, nonce }
        };
        // A peer holding half, then another arriving: the first is at its share.
        let half = FLEET_AUTH_REPLAYS_MAX as u64 / 2;
        for i in 0..half {
            r.admit(stamp(i), PEER, now).unwrap();
        }
        assert_eq!(r.admit(stamp(half), other, now), Ok(()));
        assert_eq!(r.admit(stamp(half + 1), PEER, now), Err(AuthError::Busy));
        // The other may still take up to its half.
        for i in half + 2..half + 100 {
            assert_eq!(r.admit(stamp(i), other, now), Ok(()));
        }
        // Forgotten once stale: the count of each peer with them.
        let later = now + FLEET_AUTH_SKEW.as_millis() as u64 + 1;
        let fresh = Stamp {
            at_ms: later,
            nonce: [9; NONCE_BYTES],
        };
        assert_eq!(r.admit(fresh, PEER, later), Ok(()));
        assert_eq!(r.held(), 1);
    }

    #[test]
    fn an_answer_is_signed_for_its_request_and_nothing_else() {
        let k = parse_fleet_key("combd-test-fleet-key-0123456789abcdef").unwrap();
        let mac = k.sign_answer("v2 1 aa bb", 200, "content-type: text/plain", b"{}");
        assert!(k.check_answer(
            Some(&mac),
            "v2 1 aa bb",
            200,
            "content-type: text/plain",
            b"{}"
        ));
        for (req, status, fields, body) in [
            ("v2 1 aa bc", 200, "content-type: text/plain", &b"{}"[..]),
            ("v2 1 aa bb", 201, "content-type: text/plain", b"{}"),
            ("v2 1 aa bb", 200, "content-type: text/html", b"{}"),
            ("v2 1 aa bb", 200, "content-type: text/plain", b"{ }"),
        ] {
            assert!(!k.check_answer(Some(&mac), req, status, fields, body));
        }
        assert!(!k.check_answer(None, "v2 1 aa bb", 200, "content-type: text/plain", b"{}"));
    }

    #[test]
    fn hex_goes_both_ways() {
        assert_eq!(hex(&[0, 0xab, 0xff]), "00abff");
        assert_eq!(unhex("00abFF"), Some(vec![0, 0xab, 0xff]));
        assert_eq!(unhex("0"), None);
        assert_eq!(unhex("zz"), None);
    }
}
