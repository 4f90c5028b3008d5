//! What a call of an app deployed as a module costs against the same app compiled into the
//! node: loading the example modules (compiled, then from the cache), then `N` calls of each
//! app on a real SQLite database (WAL, `synchronous=NORMAL`, each call its own transaction),
//! a fresh instance per module call as the node runs them.
//!
//!     cargo run --release --example wasm_calls -- 5000

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use combd::apps::{counter::Counter, million::Million};
use combd_shards::app::{App, CallBudget, Cx, Input, Message, SessionId};

/// What is timed: a name, the native app, the module, the input.
type Case<'a> = (&'a str, Arc<dyn App>, Arc<dyn App>, Input<'a>);

fn per_call(app: &dyn App, db: &mut rusqlite::Connection, input: &Input<'_>, n: usize) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        let tx = db.transaction().expect("begin");
        let mut effects = Vec::new();
        let mut budget = CallBudget::new(u64::MAX);
        let mut cx = Cx::new(Some(&tx), &mut effects, &mut budget);
        app.handle(&mut cx, input).expect("the call");
        tx.commit().expect("commit");
    }
    t.elapsed() / n as u32
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let tmp = std::env::temp_dir().join(format!("combd-wasm-calls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let apps = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/wasm/apps");
    let t = Instant::now();
    let deployed = combd_wasm::Deployed::load(&apps, &tmp, u64::MAX / 2, 1 << 30).expect("load");
    println!("load, compiling: {:?}", t.elapsed());
    let t = Instant::now();
    drop(combd_wasm::Deployed::load(&apps, &tmp, u64::MAX / 2, 1 << 30).expect("load"));
    println!("load, from the cache: {:?}", t.elapsed());
    let module = |name: &str| {
        deployed
            .apps()
            .into_iter()
            .find(|a| a.name() == name)
            .expect("the example module")
    };
    let session = SessionId::new(0, 1);
    let caller = combd_shards::app::Caller::default();
    let post = Input::Http {
        method: "POST",
        query: None,
        body: b"",
        client: None,
        caller: &caller,
    };
    let click = Input::Message {
        session,
        client: None,
        msg: Message::Text(r#"{"t":"click","i":17,"c":1}"#),
    };
    let attach = Input::Attach {
        session,
        query: Some("page=0"),
        client: None,
        caller: &caller,
        resumed: false,
    };
    let cases: [Case<'_>; 3] = [
        (
            "counter POST",
            Arc::new(Counter),
            module("counter-wasm"),
            post,
        ),
        (
            "million click",
            Arc::new(Million),
            module("million-wasm"),
            click,
        ),
        (
            "million attach",
            Arc::new(Million),
            module("million-wasm"),
            attach,
        ),
    ];
    for (what, native, wasm, input) in cases {
        let mut times = Vec::new();
        for app in [native, wasm] {
            let path = tmp.join(format!("{}.sqlite", app.name()));
            let mut db = rusqlite::Connection::open(&path).expect("open");
            db.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
                .and_then(|()| db.execute_batch(app.schema()))
                .expect("schema");
            per_call(app.as_ref(), &mut db, &input, n / 10);
            times.push(per_call(app.as_ref(), &mut db, &input, n));
        }
        println!(
            "{what}: native {:?} a call, module {:?} a call ({n} calls each)",
            times[0], times[1]
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
