//! ABI v2's additions on the answer's side: a module's answer may choose its content type and
//! carry header fields an app may set (`APP_RESPONSE_HEADERS`: a cookie, a redirect, caching),
//! as a native app's may. Modules built for v1 import neither and answer JSON as before.

use combd_kernel::limits::APP_HEADERS_MAX;
use combd_shards::app::{app_response_header, valid_content_type, valid_header_value};
use wasmtime::{Caller, Linker};

use crate::host::{charge, read, text, Host};

/// Defines `delete() -> i32`: the object deletes itself once the call's batch is durable and
/// answered (`Cx::delete`); 0, or the call fails (a stateless app, a fleet).
fn link_lifecycle(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "combd",
        "delete",
        |mut c: Caller<'_, Host>| -> wasmtime::Result<i32> {
            charge(&mut c)?;
            let h = c.data_mut();
            match h.cx().map_err(|s| s.0).and_then(|cx| cx.delete()) {
                Ok(()) => Ok(0),
                Err(e) => Err(h.stop(e)),
            }
        },
    )?;
    Ok(())
}

/// Defines the alarm imports: `set_alarm(at_ms: i64, ptr, len) -> i64` (its id; a limit it
/// meets fails the call), `cancel_alarm(id: i64) -> i32` (1 if it was pending), and for the
/// current input, `alarm_id() -> i64` and `alarm_late_ms() -> i64` (-1 unless it is an alarm,
/// kind 5, whose payload is `input` part 0).
fn link_alarms(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "combd",
        "set_alarm",
        |mut c: Caller<'_, Host>, at: i64, ptr: i32, n: i32| -> wasmtime::Result<i64> {
            charge(&mut c)?;
            let payload = read(&mut c, ptr, n)?;
            let h = c.data_mut();
            match h
                .cx()
                .map_err(|s| s.0)
                .and_then(|cx| cx.set_alarm(at.max(0) as u64, &payload))
            {
                Ok(id) => Ok(id),
                Err(e) => Err(h.stop(e)),
            }
        },
    )?;
    linker.func_wrap(
        "combd",
        "cancel_alarm",
        |mut c: Caller<'_, Host>, id: i64| -> wasmtime::Result<i32> {
            charge(&mut c)?;
            let h = c.data_mut();
            match h.cx().map_err(|s| s.0).and_then(|cx| cx.cancel_alarm(id)) {
                Ok(was) => Ok(i32::from(was)),
                Err(e) => Err(h.stop(e)),
            }
        },
    )?;
    linker.func_wrap(
        "combd",
        "send_to_object",
        |mut c: Caller<'_, Host>,
         ap: i32,
         an: i32,
         np: i32,
         nn: i32,
         bp: i32,
         bn: i32|
         -> wasmtime::Result<i64> {
            charge(&mut c)?;
            let app = text(read(&mut c, ap, an)?, "an app name")?;
            let name = text(read(&mut c, np, nn)?, "an object name")?;
            let body = read(&mut c, bp, bn)?;
            let h = c.data_mut();
            match h
                .cx()
                .map_err(|s| s.0)
                .and_then(|cx| cx.send_to_object(&app, &name, &body))
            {
                Ok(id) => Ok(id),
                Err(e) => Err(h.stop(e)),
            }
        },
    )?;
    linker.func_wrap("combd", "alarm_id", |c: Caller<'_, Host>| {
        c.data().input().alarm.map_or(-1, |(id, _)| id)
    })?;
    linker.func_wrap("combd", "alarm_late_ms", |c: Caller<'_, Host>| {
        c.data()
            .input()
            .alarm
            .map_or(-1, |(_, late)| late.min(i64::MAX as u64) as i64)
    })?;
    Ok(())
}

/// Defines `content_type(ptr, len) -> i32` and `header(name_ptr, name_len, value_ptr,
/// value_len) -> i32`, for the current input's answer: 0 when taken, -1 when refused (a
/// content type that is not `type/subtype[; params]`, a field an app may not set, a value with
/// CR, LF or past `app_header_value_max_bytes`, more than `app_headers_max` fields), and then
/// the answer is as if it had not been called.
pub(crate) fn link(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    link_alarms(linker)?;
    link_lifecycle(linker)?;
    linker.func_wrap(
        "combd",
        "content_type",
        |mut c: Caller<'_, Host>, ptr: i32, n: i32| -> wasmtime::Result<i32> {
            charge(&mut c)?;
            let ct = text(read(&mut c, ptr, n)?, "a content type")?;
            if !valid_content_type(&ct) {
                return Ok(-1);
            }
            let h = c.data_mut();
            if let Some(a) = h.answers.get_mut(h.current) {
                a.content_type = Some(ct);
            }
            Ok(0)
        },
    )?;
    linker.func_wrap(
        "combd",
        "header",
        |mut c: Caller<'_, Host>, np: i32, nn: i32, vp: i32, vn: i32| -> wasmtime::Result<i32> {
            charge(&mut c)?;
            let name = text(read(&mut c, np, nn)?, "a header name")?;
            let value = text(read(&mut c, vp, vn)?, "a header value")?;
            let (Some(name), true) = (app_response_header(&name), valid_header_value(&value))
            else {
                return Ok(-1);
            };
            let h = c.data_mut();
            match h.answers.get_mut(h.current) {
                Some(a) if a.headers.len() < APP_HEADERS_MAX => {
                    a.headers.push((name, value));
                    Ok(0)
                }
                _ => Ok(-1),
            }
        },
    )?;
    Ok(())
}
