//! ABI v2's additions on the answer's side: a module's answer may choose its content type and
//! carry header fields an app may set (`APP_RESPONSE_HEADERS`: a cookie, a redirect, caching),
//! as a native app's may. Modules built for v1 import neither and answer JSON as before.

use combd_kernel::limits::APP_HEADERS_MAX;
use combd_shards::app::{app_response_header, valid_content_type, valid_header_value};
use wasmtime::{Caller, Linker};

use crate::host::{charge, read, text, Host};

/// Defines `content_type(ptr, len) -> i32` and `header(name_ptr, name_len, value_ptr,
/// value_len) -> i32`, for the current input's answer: 0 when taken, -1 when refused (a
/// content type that is not `type/subtype[; params]`, a field an app may not set, a value with
/// CR, LF or past `app_header_value_max_bytes`, more than `app_headers_max` fields), and then
/// the answer is as if it had not been called.
pub(crate) fn link(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
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
