//! Tokens for the tests of verified identity: a key file holding an HS256 secret, and tokens
//! signed with it as an identity provider would (through the node's own `mint`).

use std::path::PathBuf;

/// A key file of its own for `tag` (under the temporary directory), holding `secret`.
pub fn key_file(tag: &str, secret: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("combd-auth-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("jwt.key");
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    file
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A token for `sub` (with its `name`, if any) signed with `secret`, valid for ten minutes.
pub fn token(secret: &str, sub: &str, name: Option<&str>) -> String {
    combd_shards::auth::mint(secret, sub, name, 600, now(), (None, None)).unwrap()
}

/// A WebSocket to `path` on the node's public listener, offering `token` as a browser does
/// (the subprotocols `combd, combd.bearer.<token>`).
pub fn open_ws_with(
    node: &super::TestNode,
    path: &str,
    token: &str,
) -> tungstenite::WebSocket<std::net::TcpStream> {
    use tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://127.0.0.2:{}{path}", node.port)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        format!("combd, combd.bearer.{token}").parse().unwrap(),
    );
    tungstenite::client(req, super::connect(node.public()))
        .unwrap()
        .0
}
