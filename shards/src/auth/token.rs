//! Where a request's token comes from (a Bearer header, the subprotocol `combd.bearer.<jwt>`,
//! the `combd_token` cookie), and tokens minted for development (`combd token`).

use combd_kernel::limits;
use jsonwebtoken::Algorithm;

use super::hs256_secret;

/// A token for development (`combd token`): HS256, signed with the secret in `key_file_text`,
/// naming `sub` (and `name`), valid for `ttl_seconds` from `now` (Unix seconds), with the
/// issuer and audience the node checks. A PEM key file cannot sign: its tokens come from the
/// issuer that holds the private key.
pub fn mint(
    key_file_text: &str,
    sub: &str,
    name: Option<&str>,
    ttl_seconds: u64,
    now: u64,
    settings: (Option<&str>, Option<&str>),
) -> Result<String, String> {
    if key_file_text.contains("-----BEGIN") {
        return Err(
            "the key file holds a public key: only an HS256 secret can sign here (tokens for \
                    RS256, ES256 or EdDSA come from the issuer that holds the private key)"
                .into(),
        );
    }
    let secret = hs256_secret(key_file_text)?;
    for (what, v) in [("--sub", Some(sub)), ("--name", name)] {
        if v.is_some_and(|v| v.is_empty() || v.len() > limits::AUTH_CLAIM_MAX_BYTES) {
            return Err(format!(
                "{what} must be 1 to {} bytes",
                limits::AUTH_CLAIM_MAX_BYTES
            ));
        }
    }
    let mut claims = serde_json::json!({
        "sub": sub,
        "iat": now,
        "exp": now.saturating_add(ttl_seconds),
    });
    if let Some(n) = name {
        claims["name"] = n.into();
    }
    let (issuer, audience) = settings;
    if let Some(iss) = issuer {
        claims["iss"] = iss.into();
    }
    if let Some(aud) = audience {
        claims["aud"] = aud.into();
    }
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())
}

/// The subprotocol a browser offers its token in: `combd.bearer.<jwt>`.
pub const BEARER_PROTOCOL_PREFIX: &str = "combd.bearer.";
/// The subprotocol offered beside it, which the 101 answers.
pub const PROTOCOL: &str = "combd";
/// The cookie a token may come in.
pub const COOKIE: &str = "combd_token";

/// The items of the request's `Sec-WebSocket-Protocol` fields, in order.
pub fn offered_protocols<'a>(
    headers: impl Iterator<Item = (&'a str, &'a [u8])> + 'a,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .filter(|(n, _)| n.eq_ignore_ascii_case("sec-websocket-protocol"))
        .flat_map(|(_, v)| v.split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|p| !p.is_empty())
}

/// The request's token, from the first place that has one: `Authorization: Bearer`, a
/// `combd.bearer.` subprotocol, the `combd_token` cookie.
pub fn token<'a, I>(headers: I) -> Option<&'a [u8]>
where
    I: Iterator<Item = (&'a str, &'a [u8])> + Clone + 'a,
{
    let bearer = headers
        .clone()
        .filter(|(n, _)| n.eq_ignore_ascii_case("authorization"))
        .find_map(|(_, v)| {
            let v = v.trim_ascii();
            (v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ")).then(|| v[7..].trim_ascii())
        });
    if bearer.is_some() {
        return bearer;
    }
    if let Some(t) = offered_protocols(headers.clone())
        .find_map(|p| p.strip_prefix(BEARER_PROTOCOL_PREFIX.as_bytes()))
    {
        return Some(t);
    }
    headers
        .filter(|(n, _)| n.eq_ignore_ascii_case("cookie"))
        .flat_map(|(_, v)| v.split(|b| *b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            pair.strip_prefix(COOKIE.as_bytes())
                .and_then(|rest| rest.strip_prefix(b"="))
        })
}
