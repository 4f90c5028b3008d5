//! The realtime primitives' imports (README "Presence"): `presence(topic_ptr, topic_len, ptr,
//! cap) -> i32` copies the topic's members, `{"members":[{"who","verified","name","devices",
//! "since"}…],"unlisted":n}`, and `user(sub_ptr, sub_len, ptr, cap) -> i32` where a verified
//! user is among the module's objects, `{"places":[{"object","topic","devices","since"}…],
//! "last_seen":ms|null}` (-1 for a user the node does not know). Each answers the JSON's full
//! length and copies at most `cap` bytes, as the other copying imports do; a module whose app
//! does not keep presence (no `presence()` export answering 1) reads no members.

use combd_shards::app::{AppError, Cx, Member, UserSeen};
use wasmtime::{Caller, Linker};

use crate::host::{charge, copy_out, read, text, Host};

/// `f`'s answer through the call's context, kept in the host for `copy_out` (`None`: -1).
fn answer(
    c: &mut Caller<'_, Host>,
    f: impl FnOnce(&mut Cx<'static>) -> Result<Option<serde_json::Value>, AppError>,
) -> wasmtime::Result<bool> {
    charge(c)?;
    let h = c.data_mut();
    match h.cx().map_err(|s| s.0).and_then(f) {
        Ok(Some(v)) => {
            h.reply = v.to_string().into_bytes();
            Ok(true)
        }
        Ok(None) => Ok(false),
        Err(e) => Err(h.stop(e)),
    }
}

fn members_json((members, unlisted): (Vec<Member>, u64)) -> serde_json::Value {
    let members: Vec<serde_json::Value> = members
        .into_iter()
        .map(|m| {
            serde_json::json!({
                "who": m.who, "verified": m.verified, "name": m.name,
                "devices": m.devices, "since": m.since_ms,
            })
        })
        .collect();
    serde_json::json!({ "members": members, "unlisted": unlisted })
}

fn user_json(seen: UserSeen) -> serde_json::Value {
    let places: Vec<serde_json::Value> = seen
        .places
        .into_iter()
        .map(|p| {
            serde_json::json!({
                "object": p.object, "topic": p.topic, "devices": p.devices, "since": p.since_ms,
            })
        })
        .collect();
    serde_json::json!({ "places": places, "last_seen": seen.last_seen_ms })
}

pub(crate) fn link(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "combd",
        "presence",
        |mut c: Caller<'_, Host>, tp: i32, tn: i32, ptr: i32, cap: i32| -> wasmtime::Result<i32> {
            let topic = text(read(&mut c, tp, tn)?, "a topic")?;
            answer(&mut c, |cx| {
                cx.presence(&topic).map(|m| Some(members_json(m)))
            })?;
            copy_out(&mut c, ptr, cap, |h| Some(&h.reply))
        },
    )?;
    linker.func_wrap(
        "combd",
        "user",
        |mut c: Caller<'_, Host>, sp: i32, sn: i32, ptr: i32, cap: i32| -> wasmtime::Result<i32> {
            let sub = text(read(&mut c, sp, sn)?, "a subject")?;
            if !answer(&mut c, |cx| cx.user(&sub).map(|u| u.map(user_json)))? {
                return Ok(-1);
            }
            copy_out(&mut c, ptr, cap, |h| Some(&h.reply))
        },
    )?;
    Ok(())
}
