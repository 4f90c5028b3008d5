//! A group's answers: once its sync (and in a fleet its shipment) is in, each input's answer
//! goes where its job said and the group's sends and broadcasts go out together; or every
//! input is refused.

use combd_kernel::fair::ClientKey;
use std::rc::Rc;

use crate::app::{AppError, Effect, Output};
use crate::http::Response;
use crate::job::{Attached, Reply};
use crate::stats::{ShardStats, Stage};

use super::super::{Cells, Refusal};
use super::{sync, Committed, SyncOrder};

/// Answers a group in order (or refuses every input with `refusal`), its effects together;
/// then, for the power-cut test's broken order, syncs. True if it was answered.
pub(super) async fn answer_group(
    cells: &Rc<Cells>,
    (key, client): (&str, ClientKey),
    group: Vec<Committed>,
    refusal: Option<Refusal>,
    durability: SyncOrder,
) -> bool {
    let state = &cells.state;
    let stats = state.stats();
    let wal = group.iter().rev().find_map(|c| c.wal.clone());
    let synced = refusal.is_none();
    let refusal = refusal.unwrap_or(Refusal::StorageUnavailable);
    let permit = state.acquire_awake().await;
    let first_inputs: Vec<std::time::Instant> =
        group.iter().filter_map(|c| c.first_input_at).collect();
    // The group's effects, batch after batch, go out together: when the commit task is behind
    // (a fan-out to many viewers takes longer than a batch), the batches that queued meanwhile
    // cost one fan-out, so load merges updates instead of filling the mailbox.
    let mut effects = Vec::new();
    for batch in group {
        if !synced {
            // The disk refused to sync (now or before), or the group was not shipped: nothing
            // of these batches is known to be durable, so nothing is acknowledged or sent.
            if refusal == Refusal::StorageUnavailable {
                ShardStats::add(&stats.wal_sync_failed_inputs, batch.replies.len() as u64);
            }
            for reply in batch.replies {
                cells.refuse_job_reply(reply, refusal);
            }
            continue;
        }
        for (reply, out) in batch.replies.into_iter().zip(batch.outputs) {
            // A session's error message keeps its place among the sends and broadcasts.
            effects.extend(answer(reply, out));
        }
        effects.extend(batch.effects);
    }
    let fanout = std::time::Instant::now();
    cells.apply_effects(key, effects).await;
    stats.stages.record(Stage::Fanout, fanout.elapsed());
    for at in first_inputs {
        stats.stages.record(Stage::InputToAnswer, at.elapsed());
    }
    drop(permit);
    if durability == SyncOrder::AnswerFirst {
        sync(state, client, key, wal, 1).await;
    }
    synced
}

/// Sends one input's answer where its job said; a session's error message is returned as the
/// send it becomes.
fn answer(reply: Reply, out: Result<Output, AppError>) -> Option<Effect> {
    match (reply, out) {
        (Reply::Http(r), Ok(Output::Http(resp))) => {
            let _ = r.try_send(resp);
        }
        (Reply::Http(r), Ok(Output::None)) => {
            let _ = r.try_send(Response::bytes(204, "application/json", Vec::new()));
        }
        (Reply::Http(r), Err(e)) => {
            let _ = r.try_send(e.response());
        }
        (Reply::Attach { reply, .. }, Ok(_)) => {
            let _ = reply.try_send(Attached::Yes);
        }
        (Reply::Attach { reply, .. }, Err(e)) => {
            let _ = reply.try_send(Attached::Refused(e.response()));
        }
        (Reply::Session(to), Err(e)) => {
            return Some(Effect::Send {
                to,
                text: true,
                payload: crate::ws::error_text(&e.message).into_bytes(),
            })
        }
        (Reply::Session(_), Ok(_)) | (Reply::None, _) => {}
    }
    None
}
