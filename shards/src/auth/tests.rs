//! Unit tests of the token verifier, the key files and where tokens come from.

use super::*;

const SECRET: &str = "combd-test-secret-0123456789abcdef-0123456789";

fn auth(issuer: Option<&str>, audience: Option<&str>) -> Auth {
    // A file of its own each time: tests run at once, and a file being rewritten while another
    // test reads it would read short.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!("combd-auth-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("key-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&file, format!("{SECRET}\n")).unwrap();
    Auth::new(AuthSettings {
        key_file: file,
        issuer: issuer.map(str::to_string),
        audience: audience.map(str::to_string),
    })
    .unwrap()
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn sign(claims: serde_json::Value, secret: &str) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap()
}

#[test]
fn a_good_token_names_its_client_and_a_bad_one_is_refused() {
    let a = auth(None, None);
    let good = sign(
        serde_json::json!({ "sub": "alice", "name": "Alice", "exp": now() + 60 }),
        SECRET,
    );
    let client = a.verify(good.as_bytes()).unwrap();
    assert_eq!(client.subject, "alice");
    assert_eq!(client.name.as_deref(), Some("Alice"));
    assert_eq!(client.token(), good);
    assert!(
        !format!("{client:?}").contains(&good),
        "the token is never printed"
    );
    for (why, t) in [
        (
            "another key",
            sign(
                serde_json::json!({ "sub": "a", "exp": now() + 60 }),
                &SECRET.replace('0', "1"),
            ),
        ),
        (
            "expired",
            sign(
                serde_json::json!({ "sub": "a", "exp": now() - 120 }),
                SECRET,
            ),
        ),
        (
            "not yet",
            sign(
                serde_json::json!({ "sub": "a", "exp": now() + 600, "nbf": now() + 300 }),
                SECRET,
            ),
        ),
        ("no exp", sign(serde_json::json!({ "sub": "a" }), SECRET)),
        (
            "no sub",
            sign(serde_json::json!({ "exp": now() + 60 }), SECRET),
        ),
        (
            "empty sub",
            sign(serde_json::json!({ "sub": "", "exp": now() + 60 }), SECRET),
        ),
        (
            "long name",
            sign(
                serde_json::json!({ "sub": "a", "name": "n".repeat(300), "exp": now() + 60 }),
                SECRET,
            ),
        ),
        ("garbage", "not.a.token".to_string()),
        ("alg none", {
            // {"alg":"none"} . {"sub":"a","exp":...} . (no signature)
            let b64 = |s: &str| base64_url(s.as_bytes());
            format!(
                "{}.{}.",
                b64(r#"{"alg":"none","typ":"JWT"}"#),
                b64(&format!(r#"{{"sub":"a","exp":{}}}"#, now() + 60))
            )
        }),
    ] {
        assert!(
            matches!(a.verify(t.as_bytes()), Err(Refused::Invalid(_))),
            "{why}"
        );
    }
    // Within the leeway an expired token still passes.
    let late = sign(serde_json::json!({ "sub": "a", "exp": now() - 5 }), SECRET);
    assert!(a.verify(late.as_bytes()).is_ok());
    assert!(a
        .verify(&vec![b'a'; limits::AUTH_TOKEN_MAX_BYTES + 1])
        .is_err());
}

/// Base64url without padding, as JWTs are written.
fn base64_url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

#[test]
fn issuer_and_audience_are_checked_when_set() {
    let a = auth(Some("https://id.example"), Some("combd"));
    let with = |iss: &str, aud: &str| {
        sign(
            serde_json::json!({ "sub": "a", "iss": iss, "aud": aud, "exp": now() + 60 }),
            SECRET,
        )
    };
    assert!(a
        .verify(with("https://id.example", "combd").as_bytes())
        .is_ok());
    assert!(a
        .verify(with("https://other.example", "combd").as_bytes())
        .is_err());
    assert!(a
        .verify(with("https://id.example", "other").as_bytes())
        .is_err());
    // A configured claim is required: a token without it, or with it not a string, fails.
    for claims in [
        serde_json::json!({ "sub": "a", "aud": "combd", "exp": now() + 60 }),
        serde_json::json!({ "sub": "a", "iss": "https://id.example", "exp": now() + 60 }),
        serde_json::json!({ "sub": "a", "iss": "https://id.example", "aud": 1, "exp": now() + 60 }),
    ] {
        assert!(
            a.verify(sign(claims.clone(), SECRET).as_bytes()).is_err(),
            "{claims}"
        );
    }
    // Unset, any audience (or none) passes.
    let open = auth(None, None);
    assert!(open.verify(with("x", "anything").as_bytes()).is_ok());
}

#[test]
fn a_token_whose_aud_names_an_app_is_for_that_app_only() {
    let a = auth(None, Some("combd"));
    let with = |aud: serde_json::Value| {
        let claims = serde_json::json!({ "sub": "a", "aud": aud, "exp": now() + 60 });
        a.verify(sign(claims, SECRET).as_bytes())
    };
    // The node's audience: every app.
    let all = with("combd".into()).unwrap();
    assert!(all.for_app("chat") && all.for_app("counter"));
    // An app of it: that app (or those apps) only.
    let chat = with("combd/chat".into()).unwrap();
    assert!(chat.for_app("chat") && !chat.for_app("counter"));
    let two = with(serde_json::json!(["other", "combd/chat", "combd/whoami"])).unwrap();
    assert!(two.for_app("whoami") && two.for_app("chat") && !two.for_app("bank"));
    // Neither: refused, as an audience not the node's always was.
    for aud in [
        serde_json::json!("other"),
        serde_json::json!("combd/"),
        serde_json::json!("combdx/chat"),
        serde_json::json!(["other"]),
        serde_json::json!(7),
    ] {
        assert!(with(aud.clone()).is_err(), "{aud}");
    }
    // With no audience set, an aud scopes nothing.
    let open = auth(None, None);
    let claims = serde_json::json!({ "sub": "a", "aud": "combd/chat", "exp": now() + 60 });
    let any = open.verify(sign(claims, SECRET).as_bytes()).unwrap();
    assert!(any.for_app("counter"));
}

#[test]
fn key_files_are_an_hs256_secret_or_a_public_key() {
    assert!(hs256_secret("short\n").unwrap_err().contains("at least 32"));
    assert!(hs256_secret(&format!("{SECRET}\nsecond line\n")).is_err());
    assert_eq!(hs256_secret(&format!("{SECRET}\r\n")), Ok(SECRET));
    // A public key that is not PEM is no secret.
    use base64::Engine;
    let mut der = vec![0x30, 0x59];
    der.extend([7u8; 0x59]);
    let b64 = base64::engine::general_purpose::STANDARD.encode(&der);
    for public in [
        b64.as_str(),
        r#"{"kty":"EC","crv":"P-256","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU"}"#,
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
    ] {
        assert!(
            hs256_secret(public).unwrap_err().contains("public key"),
            "{public}"
        );
    }
    // A random secret, base64 as openssl writes it, is one.
    assert!(
        hs256_secret("q8Vd0bW3nqDq3m9Jc1d3vE2QkqGz0eY7uB1lZ2dQe8p4kT0yXh6mS5rN9aF2cW1v").is_ok()
    );
    let private =
        "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n";
    assert!(key_from(private.as_bytes())
        .err()
        .unwrap()
        .contains("private key"));
    let junk = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";
    assert!(key_from(junk.as_bytes()).is_err());
}

#[test]
fn the_token_comes_from_a_bearer_header_a_subprotocol_or_a_cookie() {
    fn token_of(v: &[(&'static str, &'static str)]) -> Option<&'static [u8]> {
        let v: &'static [(&'static str, &'static str)] = Box::leak(v.to_vec().into_boxed_slice());
        token(v.iter().map(|(n, v)| (*n, v.as_bytes())))
    }
    assert_eq!(
        token_of(&[("Authorization", "Bearer abc")]),
        Some(&b"abc"[..])
    );
    assert_eq!(
        token_of(&[("authorization", "bearer  abc ")]),
        Some(&b"abc"[..])
    );
    assert_eq!(token_of(&[("Authorization", "Basic abc")]), None);
    assert_eq!(
        token_of(&[("Sec-WebSocket-Protocol", "combd, combd.bearer.x.y.z")]),
        Some(&b"x.y.z"[..])
    );
    assert_eq!(
        token_of(&[("Cookie", "a=1; combd_token=t.o.k; b=2")]),
        Some(&b"t.o.k"[..])
    );
    assert_eq!(token_of(&[("Cookie", "xcombd_token=1")]), None);
    // The header first, then the subprotocol, then the cookie.
    assert_eq!(
        token_of(&[
            ("Cookie", "combd_token=c"),
            ("Sec-WebSocket-Protocol", "combd.bearer.p"),
            ("Authorization", "Bearer h")
        ]),
        Some(&b"h"[..])
    );
    assert_eq!(
        token_of(&[
            ("Cookie", "combd_token=c"),
            ("Sec-WebSocket-Protocol", "combd.bearer.p")
        ]),
        Some(&b"p"[..])
    );
    assert_eq!(token_of(&[]), None);
}

#[test]
fn a_key_file_past_its_bound_is_refused_unread() {
    let dir = std::env::temp_dir().join(format!("combd-auth-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("big.key");
    std::fs::write(&file, vec![b'a'; limits::AUTH_KEY_FILE_MAX_BYTES + 1]).unwrap();
    let e = key::read_key(&file).err().unwrap().0;
    assert!(e.contains("more than a key"), "{e}");
    std::fs::write(&file, vec![b'a'; limits::AUTH_KEY_FILE_MAX_BYTES]).unwrap();
    assert!(
        key::read_key(&file).is_ok(),
        "at the bound: one line of 64 KiB is a secret"
    );
}

/// CVE-2026-25537: jsonwebtoken before 10.3.0 took a time claim of the wrong JSON type as
/// absent, so a string `nbf` far in the future let a not-yet-valid token through. A NumericDate
/// (RFC 7519) is a number: `exp`, `nbf` and `iat` of any other type refuse the token.
#[test]
fn a_time_claim_that_is_not_a_number_refuses_the_token() {
    let a = auth(None, None);
    let exp = now() + 600;
    for (why, claims) in [
        (
            "string nbf",
            serde_json::json!({ "sub": "a", "exp": exp, "nbf": "9999999999" }),
        ),
        (
            "numeric future nbf",
            serde_json::json!({ "sub": "a", "exp": exp, "nbf": 9_999_999_999u64 }),
        ),
        (
            "string exp",
            serde_json::json!({ "sub": "a", "exp": exp.to_string() }),
        ),
        (
            "string iat",
            serde_json::json!({ "sub": "a", "exp": exp, "iat": "9999999999" }),
        ),
        (
            "object nbf",
            serde_json::json!({ "sub": "a", "exp": exp, "nbf": { "n": 1 } }),
        ),
        (
            "boolean iat",
            serde_json::json!({ "sub": "a", "exp": exp, "iat": true }),
        ),
    ] {
        assert!(
            matches!(
                a.verify(sign(claims, SECRET).as_bytes()),
                Err(Refused::Invalid(_))
            ),
            "{why}"
        );
    }
    // Numbers in range pass: a past nbf, an iat of now.
    let fine = serde_json::json!({ "sub": "a", "exp": exp, "nbf": now() - 10, "iat": now() });
    assert!(a.verify(sign(fine, SECRET).as_bytes()).is_ok());
}

/// Test keys made once with `openssl genpkey` (never used anywhere else): a PEM public key
/// verifies the tokens its private key signs, with its own algorithm only.
#[test]
fn a_pem_public_key_verifies_its_own_algorithm_only() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    let dir = std::env::temp_dir().join(format!("combd-auth-pem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let claims = serde_json::json!({ "sub": "a", "exp": now() + 60 });
    for (alg, public, private) in [
        (
            Algorithm::RS256,
            include_str!("testdata/rsa.pub"),
            EncodingKey::from_rsa_pem(include_bytes!("testdata/rsa.key")),
        ),
        (
            Algorithm::ES256,
            include_str!("testdata/p256.pub"),
            EncodingKey::from_ec_pem(include_bytes!("testdata/p256.key")),
        ),
        (
            Algorithm::EdDSA,
            include_str!("testdata/ed25519.pub"),
            EncodingKey::from_ed_pem(include_bytes!("testdata/ed25519.key")),
        ),
    ] {
        assert_eq!(key_from(public.as_bytes()).unwrap().1, alg);
        let file = dir.join(format!("{alg:?}.pem"));
        std::fs::write(&file, public).unwrap();
        let a = Auth::new(AuthSettings {
            key_file: file,
            issuer: None,
            audience: None,
        })
        .unwrap();
        let good = jsonwebtoken::encode(&Header::new(alg), &claims, &private.unwrap()).unwrap();
        assert_eq!(a.verify(good.as_bytes()).unwrap().subject, "a", "{alg:?}");
        // The public key as an HS256 secret signs nothing here.
        let forged = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(public.as_bytes()).unwrap(),
        )
        .unwrap();
        assert!(a.verify(forged.as_bytes()).is_err(), "{alg:?}");
        let last = if good.ends_with('A') { 'B' } else { 'A' };
        let tampered = format!("{}{last}", &good[..good.len() - 1]);
        assert!(a.verify(tampered.as_bytes()).is_err(), "{alg:?}");
    }
}

fn counts(a: &Auth) -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (a.cache_hits.load(Relaxed), a.cache_misses.load(Relaxed))
}

fn named(subject: &str, expires_at: u64) -> cache::Named {
    cache::Named {
        subject: subject.into(),
        name: None,
        expires_at,
        apps: None,
    }
}

#[test]
fn a_token_seen_again_is_answered_by_the_cache_and_verified_once() {
    let a = auth(None, None);
    let good = sign(
        serde_json::json!({ "sub": "alice", "exp": now() + 60 }),
        SECRET,
    );
    let first = a.verify(good.as_bytes()).unwrap();
    assert_eq!(counts(&a), (0, 1));
    let again = a.verify(good.as_bytes()).unwrap();
    assert_eq!(counts(&a), (1, 1), "the second time is a lookup");
    assert_eq!(first, again);
    assert_eq!(
        again.token(),
        good,
        "the client carries the token it came with"
    );
    // A bad token replayed costs one check, then lookups.
    let forged = sign(
        serde_json::json!({ "sub": "mallory", "exp": now() + 60 }),
        &SECRET.replace('0', "1"),
    );
    for _ in 0..3 {
        assert!(matches!(
            a.verify(forged.as_bytes()),
            Err(Refused::Invalid(_))
        ));
    }
    assert_eq!(counts(&a), (3, 2));
    // One only not yet valid is not remembered: it will be good.
    let early = sign(
        serde_json::json!({ "sub": "a", "exp": now() + 600, "nbf": now() + 300 }),
        SECRET,
    );
    for _ in 0..2 {
        assert!(a.verify(early.as_bytes()).is_err());
    }
    assert_eq!(counts(&a), (3, 4));
    // This thread's cache: the good token and the forged one (not the early one).
    cache::with(|c| assert_eq!(c.len(), (1, 1)));
}

#[test]
fn a_cached_token_is_refused_from_its_exp_and_the_leeway_on() {
    let mut c = cache::TokenCache::new(8);
    let d = cache::digest(b"a.b.c");
    assert_eq!(c.look(1, &d, 100), cache::Known::Unseen);
    c.verified(1, d, named("a", 1000));
    let last = 1000 + limits::AUTH_LEEWAY_SECONDS;
    assert_eq!(
        c.look(1, &d, last),
        cache::Known::Verified(named("a", 1000))
    );
    assert_eq!(
        c.look(1, &d, last + 1),
        cache::Known::Refused("expired".into())
    );
    // Remembered as refused from then on, and no longer as verified.
    assert_eq!(c.look(1, &d, last), cache::Known::Refused("expired".into()));
    assert_eq!(c.len(), (0, 1));
}

#[test]
fn the_cache_forgets_its_oldest_past_auth_token_cache_entries() {
    let cap = limits::AUTH_TOKEN_CACHE_ENTRIES;
    let mut c = cache::TokenCache::new(cap);
    let d = |i: usize| cache::digest(format!("token {i}").as_bytes());
    assert_eq!(c.look(1, &d(0), 0), cache::Known::Unseen);
    for i in 0..=cap {
        c.verified(1, d(i), named("a", u64::MAX / 2));
    }
    assert_eq!(c.len(), (cap, 0));
    assert_eq!(c.look(1, &d(0), 0), cache::Known::Unseen, "the oldest went");
    assert!(matches!(c.look(1, &d(1), 0), cache::Known::Verified(_)));
    assert!(matches!(c.look(1, &d(cap), 0), cache::Known::Verified(_)));
    // Refusals past the bound push out older refusals, never a verified token.
    for i in 0..cap + 10 {
        c.refused(
            1,
            cache::digest(format!("bad {i}").as_bytes()),
            "bad signature",
        );
    }
    assert_eq!(c.len(), (cap, cap));
    assert!(matches!(c.look(1, &d(1), 0), cache::Known::Verified(_)));
    // A long reason is kept short.
    c.refused(1, d(1), &"é".repeat(200));
    let cache::Known::Refused(why) = c.look(1, &d(1), 0) else {
        panic!("refused")
    };
    assert!(why.len() <= 96 && why.starts_with('é'));
    // Entries removed and put in again keep the order's bookkeeping bounded.
    for _ in 0..3 * cap {
        c.verified(1, d(1), named("a", 5));
        c.refused(1, d(1), "expired");
    }
    assert_eq!(c.len(), (cap - 1, cap));
    let (verified, refused) = c.order_len();
    assert!(verified <= 2 * cap && refused <= 2 * cap);
}

#[test]
fn a_new_key_empties_the_cache() {
    // A key file of its own: it is rewritten below.
    let file = std::env::temp_dir().join(format!("combd-auth-reload-{}", std::process::id()));
    std::fs::write(&file, SECRET).unwrap();
    let a = Auth::new(AuthSettings {
        key_file: file.clone(),
        issuer: None,
        audience: None,
    })
    .unwrap();
    let good = sign(serde_json::json!({ "sub": "a", "exp": now() + 60 }), SECRET);
    let bad = sign(
        serde_json::json!({ "sub": "a", "exp": now() + 60 }),
        &SECRET.replace('0', "2"),
    );
    assert!(a.verify(good.as_bytes()).is_ok());
    assert!(a.verify(bad.as_bytes()).is_err());
    assert!(a.verify(good.as_bytes()).is_ok());
    assert_eq!(counts(&a), (1, 2));
    // The same file read again is a new key all the same: both are checked again.
    a.reload().unwrap();
    assert!(a.verify(good.as_bytes()).is_ok());
    assert!(a.verify(bad.as_bytes()).is_err());
    assert_eq!(counts(&a), (1, 4));
    // The key the bad token was signed with, now the node's: it passes.
    std::fs::write(&file, SECRET.replace('0', "2")).unwrap();
    a.reload().unwrap();
    assert!(a.verify(bad.as_bytes()).is_ok());
    assert!(a.verify(good.as_bytes()).is_err());
    assert_eq!(counts(&a), (1, 6));
    // A generation the cache has not seen forgets it all.
    let mut c = cache::TokenCache::new(4);
    let d = cache::digest(b"t");
    c.verified(0, d, named("a", u64::MAX / 2));
    assert!(matches!(c.look(0, &d, 0), cache::Known::Verified(_)));
    assert_eq!(c.look(7, &d, 0), cache::Known::Unseen);
    c.verified(0, d, named("a", u64::MAX / 2));
    assert_eq!(
        c.look(7, &d, 0),
        cache::Known::Unseen,
        "an older key's is not kept"
    );
}
